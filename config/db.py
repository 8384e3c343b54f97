"""Small helpers around Django's database connection."""

from __future__ import annotations

from django.db import connection


def reconnect_if_broken() -> bool:
    """Close this thread's connection if an error left it dead, so the next query opens a new one.

    Django replaces a broken connection only between requests (or when a transaction's rollback fails);
    a long request (a turn waiting on a model) whose connection was cut must do it itself. Outside a
    transaction only: inside one, the caller's work is lost anyway and must fail. Returns whether it closed.
    """
    if connection.connection is None or connection.in_atomic_block or not connection.errors_occurred:
        return False
    if connection.is_usable():
        connection.errors_occurred = False
        return False
    connection.close()
    return True
