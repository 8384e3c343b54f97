from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Workflows register themselves on import; the booking workflow also teaches the demo model its steps.
        import agents.workflows  # noqa: F401
        from agents.workflows import demo_handlers

        demo_handlers.register()
