from __future__ import annotations

from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The offline demo model answers fact extraction with a deterministic handler, so a fresh
        # install shows semantic memories without an LLM.
        from agents.llm.demo import register_structured_handler
        from memory.demo_facts import extract_facts_demo
        from memory.schemas import ExtractedFacts

        register_structured_handler(ExtractedFacts, extract_facts_demo)
