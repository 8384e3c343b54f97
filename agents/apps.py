from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The llm library records each model call through a callback; this one writes an LLMCall row.
        from agents.call_records import llm_call_save, tool_invocation_save
        from agents.llm.recording import set_call_recorder
        from agents.tools.registry import set_invocation_recorder

        set_call_recorder(llm_call_save)
        set_invocation_recorder(tool_invocation_save)
