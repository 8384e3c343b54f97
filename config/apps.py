from __future__ import annotations

from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Project-wide pieces: the pgvector extension migration, health and the worker heartbeat."""

    name = "config"
    label = "core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The process's start time, taken now (at start-up), not on the first health request.
        from config import process  # noqa: F401
