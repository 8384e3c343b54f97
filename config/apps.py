from __future__ import annotations

from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Project-wide pieces: the pgvector extension migration, health and the worker heartbeat."""

    name = "config"
    label = "core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The process's start time, taken now (at start-up), not on the first health request.
        from django.db.models.signals import pre_migrate

        from config import process  # noqa: F401

        pre_migrate.connect(_no_statement_timeout, dispatch_uid="core-no-statement-timeout")


def _no_statement_timeout(using: str = "default", **kwargs: object) -> None:
    """Migrations may build indexes on big tables: DATABASE_STATEMENT_TIMEOUT does not apply to them."""
    from django.db import connections

    with connections[using].cursor() as cursor:
        cursor.execute("SET statement_timeout = 0")
