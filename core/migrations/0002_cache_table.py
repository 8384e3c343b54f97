from __future__ import annotations

from typing import Any

from django.db import migrations

CACHE_TABLE = "app_cache"  # settings.CACHES' database cache (the default when REDIS_URL is unset)


def create_cache_tables(apps: Any, schema_editor: Any) -> None:
    """The database cache's table, whatever CACHES says now: a process started with other settings (no
    REDIS_URL) finds it. What ``createcachetable`` makes, as a migration, so ``migrate`` is all a deployment
    runs. A table that exists already is left as it is."""
    from django.core.management.commands.createcachetable import Command

    command = Command()
    command.verbosity = 0
    command.create_table(schema_editor.connection.alias, CACHE_TABLE, dry_run=False)


def drop_cache_table(apps: Any, schema_editor: Any) -> None:
    schema_editor.execute(f"DROP TABLE IF EXISTS {CACHE_TABLE}")


class Migration(migrations.Migration):
    dependencies = [("core", "0001_initial")]

    operations = [migrations.RunPython(create_cache_tables, drop_cache_table)]
