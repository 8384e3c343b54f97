from __future__ import annotations

from django.apps import AppConfig
from django.db import connections
from django.db.backends.signals import connection_created
from django.db.models.signals import pre_migrate

from core.db import dates_read_within_bounds


class CoreConfig(AppConfig):
    """Project-wide pieces: the pgvector extension migration, health and the worker heartbeat."""

    name = "core"
    label = "core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A date PostgreSQL holds and Python cannot must not fail every query that reads it.
        connection_created.connect(dates_read_within_bounds, dispatch_uid="dates_read_within_bounds")
        pre_migrate.connect(_no_statement_timeout, dispatch_uid="core-no-statement-timeout")


def _no_statement_timeout(using: str = "default", **kwargs: object) -> None:
    """Migrations may build indexes on big tables: DATABASE_STATEMENT_TIMEOUT does not apply to them."""
    with connections[using].cursor() as cursor:
        cursor.execute("SET statement_timeout = 0")
