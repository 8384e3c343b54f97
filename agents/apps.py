from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """Agent definitions: the agent model, its tools, workflows and routing (the running of a turn is the
    orchestrator's)."""

    name = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # What this app plugs into the llm library and the registries: read agents/wiring.py.
        from agents import wiring

        wiring.connect()
