from __future__ import annotations

from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Project-wide pieces: the pgvector extension migration, health and the worker heartbeat."""

    name = "config"
    label = "core"
    default_auto_field = "django.db.models.BigAutoField"
