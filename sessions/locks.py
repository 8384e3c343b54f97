"""The session's turn lease: one turn at a time per session, across processes, with no connection held.

A runner takes the session's lease (a row of ``SessionLease``: an owner and an expiry on the database's
clock) in one statement; while it holds leases, a heartbeat thread of its process extends them every third of
``TURN_LEASE_SECONDS``; it deletes the row when the turn ends. Nothing stays open between those statements:
no transaction, no advisory lock tied to a connection, so the connection goes back to the pool while the
model answers, and the lease works behind PgBouncer in transaction mode.

If the process running a turn dies, its heartbeat stops and the lease expires: a turn found ``running``
whose lease is free or expired was orphaned by a crash (``orchestrator.runtime`` resumes it from its checkpoint,
once: writing a turn's outcome checks both the lease and the turn's status). A lease can be handed over
(``hand_over``): the web request that accepted a message passes it to the worker that runs the turn.
``session_delete`` and erasure take the lease in their transaction, so no turn starts under a delete.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection, connections

from core.db import reconnect_if_broken
from core.errors import Refusal
from sessions.models import SessionLease

logger = logging.getLogger(__name__)

_TABLE = SessionLease._meta.db_table

_TAKE = f"""
INSERT INTO {_TABLE} AS l (session_id, owner, expires_at, handed_over_at)
VALUES (%(session)s, %(owner)s, clock_timestamp() + make_interval(secs => %(seconds)s), NULL)
ON CONFLICT (session_id) DO UPDATE
SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, handed_over_at = NULL
WHERE l.expires_at < clock_timestamp() OR l.owner = EXCLUDED.owner OR l.owner = %(previous)s
RETURNING 1
"""
_HAND_OVER = f"""
UPDATE {_TABLE} SET expires_at = clock_timestamp() + make_interval(secs => %(seconds)s),
handed_over_at = clock_timestamp()
WHERE session_id = %(session)s AND owner = %(owner)s
RETURNING 1
"""
# A lease handed over and never claimed for ``%(seconds)s``, whose owner is one of ``%(owners)s``: its turn's task is
# known to be gone (not in the queue, not running); the lease is let go so that the sweep resumes the turn.
_LET_GO_UNCLAIMED = f"""
UPDATE {_TABLE} SET expires_at = clock_timestamp() - interval '1 second'
WHERE owner = ANY(%(owners)s::uuid[]) AND handed_over_at IS NOT NULL
AND handed_over_at < clock_timestamp() - make_interval(secs => %(seconds)s)
RETURNING session_id
"""
# A lease given up by its owner before its turn ran (the task failed before it picked the turn up).
_LET_GO = f"UPDATE {_TABLE} SET expires_at = clock_timestamp() - interval '1 second' WHERE owner = %(owner)s"
_EXTEND = f"""
UPDATE {_TABLE} SET expires_at = clock_timestamp() + make_interval(secs => %(seconds)s)
WHERE session_id = %(session)s AND owner = %(owner)s
RETURNING 1
"""
_EXTEND_MANY = f"""
UPDATE {_TABLE} l SET expires_at = clock_timestamp() + make_interval(secs => %(seconds)s)
FROM unnest(%(sessions)s::uuid[], %(owners)s::uuid[]) AS h(session_id, owner)
WHERE l.session_id = h.session_id AND l.owner = h.owner
RETURNING l.session_id
"""
_RELEASE = f"DELETE FROM {_TABLE} WHERE session_id = %(session)s AND owner = %(owner)s"
# A statement that a turn's outcome joins: true while ``owner`` holds the session's lease.
HELD_SQL = (
    f"EXISTS (SELECT 1 FROM {_TABLE} WHERE session_id = %(session)s AND owner = %(lease_owner)s"
    " AND expires_at >= clock_timestamp())"
)


class SessionBusyError(Refusal):
    """Another turn is running on this session and did not finish within the wait."""

    code = "session_busy"
    status = 409
    default_message = "Another turn is running on this session."


class TurnLockLost(Exception):
    """The lease ran out (the runner was cut off or stalled) and another process took the turn over."""

    code = "turn_taken_over"


def lease_seconds() -> float:
    return float(getattr(settings, "TURN_LEASE_SECONDS", 30.0))


def _execute(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


class SessionTurnLock:
    """A session's turn lease, held by ``owner`` (a new one unless given: a lease handed over keeps its owner)."""

    def __init__(self, session_id: uuid.UUID | str, owner: uuid.UUID | str | None = None) -> None:
        self.session_id = uuid.UUID(str(session_id))
        self.owner = uuid.UUID(str(owner)) if owner is not None else uuid.uuid4()
        self.held = False

    def _params(self, seconds: float | None = None, previous: uuid.UUID | None = None) -> dict[str, Any]:
        return {
            "session": self.session_id,
            "owner": self.owner,
            "seconds": seconds or lease_seconds(),
            "previous": previous or self.owner,
        }

    def try_acquire(self, *, seconds: float | None = None) -> bool:
        """Take the lease if it is free, expired or already ours (a handed-over lease is taken back)."""
        return self._take(self._params(seconds))

    def claim(self, handed_over_by: uuid.UUID | str) -> bool:
        """A turn worker takes a lease handed over to it (``hand_over``) under an owner of its own, so that a second
        delivery of the same task (the broker's redelivery, a sweep's resend) cannot take it while this one runs.
        Also takes a lease that is free or expired. False when someone else holds it."""
        return self._take(self._params(previous=uuid.UUID(str(handed_over_by))))

    def _take(self, params: dict[str, Any]) -> bool:
        self.held = bool(_execute(_TAKE, params))
        if self.held:
            _heartbeat.hold(self)
            _owned_here()[self.session_id] = self
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

    def extend(self, *, seconds: float | None = None) -> bool:
        """Push the expiry on; False (and not held) when the lease is no longer ours."""
        self.held = bool(_execute(_EXTEND, self._params(seconds)))
        if not self.held:
            _heartbeat.drop(self)
        return self.held

    def holds_or_retakes(self) -> bool:
        """Before writing a turn's outcome: do we still hold the lease? If it ran out and nobody took it, take
        it again; if someone else holds it, they have taken the turn over as orphaned, and we must not write."""
        reconnect_if_broken()
        try:
            if self.extend():
                return True
        except (OperationalError, InterfaceError):
            if not reconnect_if_broken():
                raise
        return self.try_acquire()

    def hand_over(self, *, seconds: float) -> str:
        """Stop extending the lease here and give it ``seconds`` for its next holder to take it (with this
        owner: ``SessionTurnLock(session, owner=...)``). Returns the owner to pass on."""
        _heartbeat.drop(self)
        _disown(self)
        _execute(_HAND_OVER, self._params(seconds))
        self.held = False
        return str(self.owner)

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        _heartbeat.drop(self)
        _disown(self)
        try:
            _execute_no_rows(_RELEASE, self._params())
        except Exception:  # the lease expires on its own
            logger.warning(
                "could not release the turn lease of %s; it expires by itself", self.session_id, exc_info=True
            )


# The leases this thread took, by session: a turn runs on the thread that took (or was handed) its lease, and
# writes its outcome under that one. Per thread, not per process: a sweep in another thread of the same worker
# may take over a lease that ran out, and the stalled runner must not write under the new owner's.
_owned = threading.local()


def _owned_here() -> dict[uuid.UUID, SessionTurnLock]:
    owned: dict[uuid.UUID, SessionTurnLock] | None = getattr(_owned, "leases", None)
    if owned is None:
        owned = _owned.leases = {}
    return owned


def _disown(lock: SessionTurnLock) -> None:
    owned = _owned_here()
    if owned.get(lock.session_id) is lock:
        owned.pop(lock.session_id, None)


def lease_of(session_id: uuid.UUID | str) -> SessionTurnLock | None:
    """The lease this thread holds for the session (to write a turn's outcome under it), if any."""
    return _owned_here().get(uuid.UUID(str(session_id)))


def _execute_no_rows(sql: str, params: dict[str, Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def lease_let_go(owner: uuid.UUID | str) -> None:
    """Let a handed-over lease go before its turn ran (its task failed first): the sweep resumes the turn at
    its next pass instead of when the hand-over would have run out (``TURN_QUEUE_SECONDS``)."""
    _execute_no_rows(_LET_GO, {"owner": uuid.UUID(str(owner))})


def unclaimed_leases_let_go(owners: list[str], *, older_than: float) -> list[uuid.UUID]:
    """Let go of the leases handed over by ``owners`` more than ``older_than`` seconds ago and never claimed (the
    caller knows their tasks are gone); returns their sessions."""
    if not owners:
        return []
    rows = _execute(_LET_GO_UNCLAIMED, {"owners": [uuid.UUID(o) for o in owners], "seconds": older_than})
    return [uuid.UUID(str(row[0])) for row in rows]


def session_lease_take_in_transaction(session_id: uuid.UUID | str) -> bool:
    """Inside the caller's transaction: take the session's lease until it commits (a delete or an erasure, which
    delete the row with the session). False when a turn holds it."""
    lock = SessionTurnLock(session_id)
    return bool(_execute(_TAKE, lock._params(seconds=3600)))


def session_is_locked(session_id: uuid.UUID | str) -> bool:
    """True when some runner holds this session's lease (a turn is running somewhere)."""
    held = f"SELECT 1 FROM {_TABLE} WHERE session_id = %(session)s AND expires_at >= clock_timestamp()"
    return bool(_execute(held, {"session": uuid.UUID(str(session_id))}))


class _Heartbeat:
    """One thread per process that extends every lease this process holds, every third of the lease."""

    def __init__(self) -> None:
        self._held: dict[tuple[uuid.UUID, uuid.UUID], SessionTurnLock] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def hold(self, lock: SessionTurnLock) -> None:
        with self._lock:
            self._held[(lock.session_id, lock.owner)] = lock
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="turn-lease-heartbeat", daemon=True)
                self._thread.start()

    def drop(self, lock: SessionTurnLock) -> None:
        with self._lock:
            self._held.pop((lock.session_id, lock.owner), None)

    def held_count(self) -> int:
        with self._lock:
            return len(self._held)

    def _run(self) -> None:
        while True:
            time.sleep(max(0.2, lease_seconds() / 3))
            with self._lock:
                held = list(self._held.values())
            if not held:
                continue
            try:
                kept = {
                    row[0]
                    for row in _execute(
                        _EXTEND_MANY,
                        {
                            "sessions": [lock.session_id for lock in held],
                            "owners": [lock.owner for lock in held],
                            "seconds": lease_seconds(),
                        },
                    )
                }
                for lock in held:
                    if lock.session_id not in kept:
                        self.drop(lock)  # taken over; the runner finds out before it writes
            except Exception:
                logger.warning("could not extend %s turn lease(s); retrying", len(held), exc_info=True)
                close_old_connections()
            finally:
                # The heartbeat holds no connection between beats.
                connections["default"].close()


_heartbeat = _Heartbeat()
