"""Small helpers around the app's connections: the database's, and a local Redis for the broker."""

from __future__ import annotations

import socket

from django.db import connection, connections


def database_url(name: str | None = None) -> str:
    """A ``DATABASE_URL`` for the database this process uses (or database ``name`` on the same server),
    for processes it starts: test workers and servers, benchmark servers."""
    s = connections["default"].settings_dict
    url = f"postgresql://{s['USER']}:{s['PASSWORD']}@/{name or s['NAME']}?host={s['HOST']}"
    return url + (f"&port={s['PORT']}" if s.get("PORT") else "")


def redis_reachable(host: str = "127.0.0.1", port: int = 6379) -> bool:
    """Does a Redis answer PING at ``host:port`` within half a second?"""
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


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
