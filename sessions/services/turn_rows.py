"""A turn's rows: the hand-written statements the orchestrator writes a turn with.

The new turn inserted with its before-call checkpoint and the session's first title (``turn_insert``), its
fields written only while it is unfinished (``turn_write_unfinished``: the fence against a second runner), and
its completion, with its model calls' records, only while the runner holds the session's lease
(``turn_complete_write``). Each in one statement where a transaction of a few took more round trips.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection, transaction
from django.db.models.sql import InsertQuery
from django.utils import timezone

from agents.call_records import llm_calls_insert_sql
from sessions.locks import HELD_SQL
from sessions.models import TURN_UNFINISHED, ChatSession, Checkpoint, Turn
from sessions.services.checkpoints import checkpoint_before_call, checkpoint_insert_sql, checkpoint_number_taken

# After the turn's INSERT (``t``): the session row locked and read (``s``), its first title, the checkpoint.
_CHECKPOINT_AND_TITLE = (
    ", s AS (SELECT id, state, data, retry_count FROM chat_sessions_chatsession WHERE id = %s FOR UPDATE)"
    ", titled AS (UPDATE chat_sessions_chatsession SET title = %s WHERE id = %s AND title = '' AND %s <> ''"
    " RETURNING id)"
    f", c AS ({checkpoint_insert_sql('s', turn='t.id', tables='s, t')} RETURNING seq)"
    " SELECT t.id FROM t"
)


def turn_insert_with_checkpoint(*, turn: Turn, title: str) -> bool:
    """Insert the unsaved ``turn``, its before-call checkpoint and the session's first ``title`` (when it has
    none) in one statement: one round trip where a transaction took six. False, and nothing written, when the
    checkpoint could not take its number (another writer took it while this statement waited for the session's
    row lock); ``IntegrityError`` for any other conflict (a turn with the same Idempotency-Key)."""
    query = InsertQuery(Turn)
    query.insert_values([f for f in Turn._meta.local_concrete_fields if not f.primary_key], [turn])
    compiler: Any = query.get_compiler(using="default")
    compiler.returning_fields = [Turn._meta.pk]
    [(insert, insert_params)] = compiler.as_sql()
    detail = f"before a model call, turn #{turn.seq}"
    params = [*insert_params, turn.session_id, title, turn.session_id, title]
    params += ["", Checkpoint.Reason.BEFORE_CALL.value, detail, timezone.now()]
    # A statement alone is atomic; inside a caller's transaction (a test's), a savepoint keeps a refusal from
    # spoiling it.
    guard = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    try:
        with guard, connection.cursor() as cursor:
            cursor.execute("WITH t AS (" + insert + ")" + _CHECKPOINT_AND_TITLE, params)
            (turn_id,) = cursor.fetchone()
    except IntegrityError as exc:
        if checkpoint_number_taken(exc):
            return False
        raise
    turn.pk = turn_id
    turn._state.adding = False
    turn._state.db = "default"
    return True


def turn_insert(*, turn: Turn, title: str) -> None:
    """Save the new ``turn`` with its before-call checkpoint and the session's first ``title`` (when it has
    none): in one statement (``turn_insert_with_checkpoint``), or in a transaction of a few when another writer
    (a staff action) took the checkpoint's number meanwhile."""
    if turn_insert_with_checkpoint(turn=turn, title=title):
        return
    with transaction.atomic():
        turn.save(force_insert=True)
        checkpoint_before_call(session=turn.session, turn=turn)
        if title:
            ChatSession.objects.filter(pk=turn.session_id, title="").update(title=title)


def turn_write_unfinished(*, turn: Turn, **fields: Any) -> bool:
    """Write ``fields`` to the turn only while it is unfinished: the fence against a second runner. False when
    it is finished (or gone) already, and nothing was written; the instance is updated with the plain values.

    A runner whose connection was cut during the model call lost its lease with it; the next message or the
    sweep may have finished the turn meanwhile. A lease check before the write cannot see that (the lease is
    free again), the turn's status can: a finished turn is never written twice."""
    written = bool(Turn.objects.filter(pk=turn.pk, status__in=TURN_UNFINISHED).update(**fields))
    if written:
        for name, value in fields.items():
            if not hasattr(value, "resolve_expression"):  # plain values; an expression is read back by the caller
                setattr(turn, name, value)
    return written


_COMPLETE = """
WITH held AS (
    SELECT {held} AS ok
), s AS (
    UPDATE chat_sessions_chatsession SET updated_at = %(now)s{session_sets}
    WHERE id = %(session)s AND (SELECT ok FROM held)
      AND EXISTS (SELECT 1 FROM chat_sessions_turn WHERE id = %(turn)s AND status = ANY(%(unfinished)s))
    RETURNING state, status, version, retry_count, updated_at, data
), t AS (
    UPDATE chat_sessions_turn SET status = %(status)s, assistant_message = %(reply)s, steps = %(steps)s,
        retrieval = %(retrieval)s::jsonb, prompt_tokens = %(prompt_tokens)s, completed_at = %(now)s,
        state_after = (SELECT state FROM s), error = '',
        composition = COALESCE(%(composition)s::jsonb, composition),
        is_demo = is_demo OR %(is_demo)s, truncated = truncated OR %(truncated)s
    WHERE id = %(turn)s AND status = ANY(%(unfinished)s) AND EXISTS (SELECT 1 FROM s)
    RETURNING id
), calls AS (
    {insert_calls} WHERE EXISTS (SELECT 1 FROM t)
)
SELECT (SELECT ok FROM held), (SELECT count(*) FROM t), s.state, s.status, s.version, s.retry_count,
    s.updated_at, s.data
FROM (SELECT 1) AS one LEFT JOIN s ON true
"""
_RESET_FAILURES = ", retry_count = 0, version = CASE WHEN retry_count > 0 THEN version + 1 ELSE version END"


@dataclass(frozen=True)
class CompleteWrite:
    """What ``turn_complete_write`` found: whether the lease was held, whether the turn was completed, and the
    session's row as written (state, status, version, retry count, updated at, data) when it was."""

    held: bool
    completed: bool
    session_row: tuple[Any, ...] = ()


def turn_complete_write(
    *,
    session_id: Any,
    turn_id: int,
    lease_owner: Any,
    fields: dict[str, Any],
    calls_json: str,
    resets_failures: bool,
    now: Any,
) -> CompleteWrite:
    """Complete an unfinished turn in one statement, only while ``lease_owner`` holds the session's lease: the
    session touched (its failure count reset when ``resets_failures``), the turn's ``fields`` written (status,
    reply, steps, retrieval, prompt tokens; composition, is_demo and truncated when given), and its model calls'
    records (``calls_json``, ``agents.call_records.llm_calls_json``) inserted with it."""
    sql = _COMPLETE.format(
        held=HELD_SQL,
        session_sets=_RESET_FAILURES if resets_failures else "",
        insert_calls=llm_calls_insert_sql("calls"),
    )
    params = {
        "lease_owner": lease_owner,
        "now": now,
        "session": session_id,
        "turn": turn_id,
        "unfinished": [str(s) for s in TURN_UNFINISHED],
        "status": str(fields["status"]),
        "reply": fields["assistant_message"],
        "steps": fields["steps"],
        "retrieval": json.dumps(fields["retrieval"], cls=DjangoJSONEncoder),
        "prompt_tokens": fields["prompt_tokens"],
        "composition": json.dumps(fields["composition"], cls=DjangoJSONEncoder) if "composition" in fields else None,
        "is_demo": bool(fields.get("is_demo")),
        "truncated": bool(fields.get("truncated")),
        "calls": calls_json,
    }
    with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return CompleteWrite(held=bool(row[0]), completed=bool(row[1]), session_row=tuple(row[2:]) if row[1] else ())


def turn_reopen_kept(*, turn_id: int) -> bool:
    """A message that was kept for a person and never answered (completed with no reply, no staff reply), opened
    again so that the agent answers it once the chat is handed back. False when it was answered meanwhile (one
    statement: a second hand-back cannot open it twice)."""
    kept = Turn.objects.filter(pk=turn_id, status=Turn.Status.COMPLETED, assistant_message="", staff_replies=[])
    return bool(kept.update(status=Turn.Status.PENDING, completed_at=None))
