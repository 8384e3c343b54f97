"""The session's turn lock: one turn at a time per session, across processes.

The lock is a PostgreSQL session-level advisory lock keyed by the session id, held by the connection that
runs the turn — not a transaction, so no transaction stays open while a model answers. If the process
running a turn dies, its connection closes and PostgreSQL releases the lock: a turn found ``running``
while its lock is free was orphaned by a crash (``agents.runtime`` resumes it from its checkpoint).
``session_delete`` takes the transaction-level form of the same key.
"""

from __future__ import annotations

import logging
import time
import uuid

from django.db import InterfaceError, OperationalError, connection

from config.db import reconnect_if_broken
from config.errors import Refusal

logger = logging.getLogger(__name__)

# Advisory-lock namespace: the high bits of every key we take, so our locks never collide with other users
# of pg_advisory_lock on the same database.
_LOCK_NAMESPACE = 0x5A17 << 48


class SessionBusyError(Refusal):
    """Another turn is running on this session and did not finish within the wait."""

    code = "session_busy"
    status = 409
    default_message = "Another turn is running on this session."


class TurnLockLost(Exception):
    """The database connection holding the turn lock was lost and another process took the turn over."""

    code = "turn_taken_over"


def lock_key(session_id: uuid.UUID | str) -> int:
    raw = uuid.UUID(str(session_id)).int & ((1 << 48) - 1)
    key = _LOCK_NAMESPACE | raw
    return key - (1 << 64) if key >= 1 << 63 else key


class SessionTurnLock:
    """A PostgreSQL advisory lock for one session's turns, held by this thread's connection."""

    def __init__(self, session_id: uuid.UUID | str) -> None:
        self.key = lock_key(session_id)
        self.held = False

    def try_acquire(self) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [self.key])
            row = cursor.fetchone()
        self.held = bool(row and row[0])
        return self.held

    def acquire(self, *, wait_seconds: float) -> bool:
        deadline = time.monotonic() + max(0.0, wait_seconds)
        delay = 0.02
        while True:
            if self.try_acquire():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def holds_or_retakes(self) -> bool:
        """Before writing a turn's outcome: do we still own the lock?

        A session-level advisory lock dies with the connection that took it, and the connection may have
        been cut while the model answered: a dead one is replaced first. If our lock is gone, take it
        again on the new connection; if someone else holds it, they have taken the turn over as
        orphaned, and we must not write.
        """
        reconnect_if_broken()
        unsigned = self.key & 0xFFFFFFFFFFFFFFFF
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted "
                    "AND classid = %s AND objid = %s AND objsubid = 1",
                    [unsigned >> 32, unsigned & 0xFFFFFFFF],
                )
                if cursor.fetchone():
                    return True
        except (OperationalError, InterfaceError):
            # Cut since its last use: the lock went with it. Reconnect (or fail here if the database is down).
            if not reconnect_if_broken():
                raise
        return self.try_acquire()

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [self.key])
        except Exception:  # a dead connection has released the lock already
            logger.warning("could not release the turn lock explicitly; the connection is gone", exc_info=True)


def session_is_locked(session_id: uuid.UUID | str) -> bool:
    """True when some connection holds this session's turn lock (a turn is running somewhere)."""
    lock = SessionTurnLock(session_id)
    if lock.try_acquire():
        lock.release()
        return False
    return True
