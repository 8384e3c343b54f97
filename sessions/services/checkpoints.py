"""The append-only checkpoint log of a session: the statements that append to it, and its retention.

Checkpoint sequence numbers are allocated under the session row lock, in a short transaction, so they are
gap-free per session and never clash. ``checkpoint_insert_sql`` is the ``INSERT`` the one-statement writes
of ``versioned`` and ``turn_rows`` take their checkpoint with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from core.db import instances_from_rows
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.selectors import prune_candidates, sessions_over_checkpoint_limit


def checkpoint_number_taken(exc: IntegrityError) -> bool:
    """The error of a checkpoint numbered with a number another writer took (``checkpoint_seq_unique``)."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == "checkpoint_seq_unique"


def checkpoint_record(
    *,
    session: ChatSession,
    reason: str,
    turn: Turn | None = None,
    transition: str = "",
    detail: str = "",
) -> Checkpoint:
    """Append a checkpoint with the session's state, data and retry count as stored right now.

    The row lock serializes sequence numbers per session; the snapshot is read under the same lock, so
    it is what the database holds, even if the caller's copy is older.
    """
    if reason not in Checkpoint.Reason.values:
        raise ValueError(f"unknown checkpoint reason {reason!r}")
    fast = _checkpoint_insert(session_id=session.pk, turn=turn, reason=reason, transition=transition, detail=detail)
    if fast is not None:
        return fast
    # The session is gone (the ORM says so below), or another writer took the next number while this one waited
    # for the row lock: read the last number again after the lock, in a statement of its own.
    # No savepoint inside a caller's transaction: a failure here fails the caller's work as a whole.
    with transaction.atomic(savepoint=False):
        row = ChatSession.objects.select_for_update().values("state", "data", "retry_count").get(pk=session.pk)
        # A statement of its own, after the row lock is granted: it sees a checkpoint committed meanwhile.
        last = Checkpoint.objects.filter(session_id=session.pk).aggregate(m=Max("seq"))["m"] or 0
        return Checkpoint.objects.create(
            session_id=session.pk,
            seq=last + 1,
            turn=turn,
            state=row["state"],
            data=row["data"],
            retry_count=row["retry_count"],
            transition=transition[:140],
            reason=reason,
            detail=detail,
        )


# The checkpoint's columns, in the order a ``RETURNING`` of them gives (``checkpoint_from_row`` reads it).
CHECKPOINT_COLUMNS = tuple(f.column for f in Checkpoint._meta.concrete_fields)


def checkpoint_insert_sql(source: str, *, turn: str = "%s", tables: str = "") -> str:
    """An ``INSERT`` of one checkpoint taken from ``source`` (a CTE with the session's id, state, data and retry
    count, as written or locked by the same statement), numbered after the session's last one, returning its
    row. Its parameters, positional: the turn's id (unless ``turn`` is an expression), the transition, the
    reason, the detail and the time. ``tables``: what to select from, when more than ``source``."""
    return (
        "INSERT INTO chat_sessions_checkpoint"
        " (session_id, seq, turn_id, state, data, retry_count, transition, reason, detail, created_at)"
        f" SELECT {source}.id, COALESCE((SELECT MAX(k.seq) FROM chat_sessions_checkpoint k"
        f" WHERE k.session_id = {source}.id), 0) + 1, {turn}, {source}.state, {source}.data, {source}.retry_count,"
        f" %s, %s, %s, %s FROM {tables or source}"
    )


_CHECKPOINT_INSERT = (
    "WITH s AS (SELECT id, state, data, retry_count FROM chat_sessions_chatsession WHERE id = %s FOR UPDATE) "
    + checkpoint_insert_sql("s")
    + f" ON CONFLICT (session_id, seq) DO NOTHING RETURNING {', '.join(CHECKPOINT_COLUMNS)}"
)


def _checkpoint_insert(
    *, session_id: Any, turn: Turn | None, reason: str, transition: str, detail: str
) -> Checkpoint | None:
    """``checkpoint_record`` in one statement: the session row locked, its state read and the next number taken
    together. None when it wrote nothing: no such session, or a checkpoint committed by another writer while
    this statement waited for the row lock (its snapshot predates it, so its number was taken: the caller reads
    again in statements of their own)."""
    params = [session_id, turn.pk if turn is not None else None, transition[:140], reason, detail, timezone.now()]
    with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
        cursor.execute(_CHECKPOINT_INSERT, params)
        row = cursor.fetchone()
    return None if row is None else checkpoint_from_row(row)


def checkpoint_from_row(row: Any) -> Checkpoint:
    """The checkpoint of a row of ``CHECKPOINT_COLUMNS`` (a ``RETURNING`` of them), as a query would give it."""
    return instances_from_rows(Checkpoint, [row])[0]


def checkpoint_before_call(*, session: ChatSession, turn: Turn) -> Checkpoint:
    """The checkpoint taken before every model call: where to resume if the process dies during the call."""
    return checkpoint_record(
        session=session,
        reason=Checkpoint.Reason.BEFORE_CALL,
        turn=turn,
        detail=f"before a model call, turn #{turn.seq}",
    )


# --- retention -------------------------------------------------------------------------------------------
def checkpoints_prune(
    *,
    keep_last: int | None = None,
    dry_run: bool = False,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> int:
    """Delete old checkpoints: per session keep the newest ``keep_last`` and every one whose reason is in
    ``PRUNE_KEEP_REASONS`` (transitions, resets, resumes, failures, handoffs). Returns how many went
    (or would go, with ``dry_run``). ``on_progress(done, total, deleted)`` is called after each session.
    """
    keep = int(keep_last if keep_last is not None else getattr(settings, "CHECKPOINT_KEEP_LAST", 50))
    if keep < 1:
        raise ValueError("keep_last must be at least 1")
    session_ids = list(sessions_over_checkpoint_limit(keep_last=keep))
    total = 0
    for index, session_id in enumerate(session_ids, start=1):
        doomed = prune_candidates(session_id=session_id, keep_last=keep)
        if dry_run:
            total += doomed.count()
        else:
            deleted, _ = Checkpoint.objects.filter(pk__in=list(doomed.values_list("pk", flat=True))).delete()
            total += deleted
        if on_progress is not None:
            on_progress(index, len(session_ids), total)
    return total
