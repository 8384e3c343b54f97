"""A named database on the same PostgreSQL server for the memory benchmarks, migrated and selected.

The benchmarks keep their data apart from the app's and the tests' databases (and reuse it across runs:
building a million memories takes a while).
"""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import psycopg
from django.core.management import call_command
from django.db import connections


def use_database(name: str) -> None:
    """Create ``name`` if missing, point Django's default connection at it, and migrate it."""
    settings_dict = connections["default"].settings_dict
    conninfo = {
        "host": settings_dict["HOST"] or None,
        "port": settings_dict["PORT"] or None,
        "user": settings_dict["USER"],
        "password": settings_dict["PASSWORD"] or None,
        "dbname": "postgres",
    }
    with psycopg.connect(**{k: v for k, v in conninfo.items() if v is not None}, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    connections["default"].close()
    settings_dict["NAME"] = name
    with redirect_stdout(io.StringIO()):
        call_command("migrate", verbosity=0, interactive=False)
