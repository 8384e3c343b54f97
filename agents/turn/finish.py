"""A turn's outcome, saved through the fence: completed (with its after-work enqueued) or failed."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from agents.call_records import llm_calls_give_back, llm_calls_insert_sql, llm_calls_json, llm_calls_take
from agents.llm.prompt import TurnText
from agents.turn.context import UNFINISHED, write_unfinished
from config.db import reconnect_if_broken
from memory.services import memory_writes_enqueue
from sessions.locks import HELD_SQL, TurnLockLost, lease_of
from sessions.models import ChatSession, Turn
from sessions.services import turn_failure_record
from sessions.summaries import summary_request_if_due

if TYPE_CHECKING:
    from sessions.context import TurnHistory

logger = logging.getLogger("agents.runtime")


def complete_turn(
    session: ChatSession,
    turn: Turn,
    *,
    reply: str,
    steps: int,
    composition: dict[str, Any],
    retrieval: dict[str, Any],
    prompt_tokens: int,
    is_demo: bool,
    history: TurnHistory | None = None,
    resets_failures: bool = False,
    truncated: bool = False,
) -> None:
    """Save the reply, in one statement: the lock still ours, the session touched (its failure count reset when
    ``resets_failures``: free chat has no transition to reset it), the turn completed, the records of its model
    calls inserted; after it, the turn's background work is enqueued. ``history`` is what the turn's prompt was
    built from, if it was."""
    now = timezone.now()
    fields: dict[str, Any] = {
        "status": Turn.Status.COMPLETED,
        "assistant_message": reply,
        "steps": steps,
        "retrieval": retrieval,
        "prompt_tokens": prompt_tokens,
        "completed_at": now,
        "error": "",
    }
    # Set only when there is something to say (what an earlier step wrote stays otherwise).
    if composition:
        fields["composition"] = composition
    if is_demo:
        fields["is_demo"] = True
    if truncated:
        fields["truncated"] = True
    calls = llm_calls_take(turn.pk)
    try:
        row = _complete(session, turn, fields, calls=calls, resets_failures=resets_failures, now=now)
    except BaseException:
        llm_calls_give_back(turn.pk, calls)
        raise
    state, status, version, retry_count, updated_at, data = row
    session.state, session.status, session.version = state, status, version
    session.retry_count, session.updated_at = retry_count, updated_at
    session.data = json.loads(data) if isinstance(data, str) else data
    for name, value in {**fields, "state_after": state}.items():
        setattr(turn, name, value)
    finished = TurnText(seq=turn.seq, user=turn.user_message, assistant=reply)
    # Outside a transaction (as a turn runs) at once; inside one (a test's), when it commits.
    transaction.on_commit(lambda: after_turn(turn, session, history=history, finished=finished))


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


def _complete(
    session: ChatSession,
    turn: Turn,
    fields: dict[str, Any],
    *,
    calls: list[Any],
    resets_failures: bool,
    now: Any,
) -> tuple[Any, ...]:
    lock = lease_of(session.pk)
    if lock is None:
        raise TurnLockLost("This turn's lease is not held here; another runner is finishing it. Nothing was written.")
    sql = _COMPLETE.format(
        held=HELD_SQL,
        session_sets=_RESET_FAILURES if resets_failures else "",
        insert_calls=llm_calls_insert_sql("calls"),
    )
    params = {
        "lease_owner": lock.owner,
        "now": now,
        "session": session.pk,
        "turn": turn.pk,
        "unfinished": [str(s) for s in UNFINISHED],
        "status": str(fields["status"]),
        "reply": fields["assistant_message"],
        "steps": fields["steps"],
        "retrieval": json.dumps(fields["retrieval"], cls=DjangoJSONEncoder),
        "prompt_tokens": fields["prompt_tokens"],
        "composition": json.dumps(fields["composition"], cls=DjangoJSONEncoder) if "composition" in fields else None,
        "is_demo": bool(fields.get("is_demo")),
        "truncated": bool(fields.get("truncated")),
        "calls": llm_calls_json(calls),
    }
    cut = False
    for attempt in (1, 2):
        try:
            with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone()
        except (OperationalError, InterfaceError):
            # Cut while the model answered (or while this statement's answer came back): reconnect, take the
            # lease again if it is free, and try once more.
            if attempt == 2 or not reconnect_if_broken():
                raise
            cut, row = True, (False, 0)
        held, completed = row[0], row[1]
        if completed:
            return tuple(row[2:])
        if held:
            break
        # The lease is not ours (it ran out, or was taken over): retake it when it is free.
        if attempt == 2 or not lock.holds_or_retakes():
            raise TurnLockLost("The database connection was lost mid-turn and another request is finishing this turn.")
    if cut and Turn.objects.filter(pk=turn.pk, status=Turn.Status.COMPLETED, completed_at=now).exists():
        # The first attempt was committed; only its answer was lost with the connection. Done, as written.
        written = (
            ChatSession.objects.filter(pk=session.pk)
            .values_list("state", "status", "version", "retry_count", "updated_at", "data")
            .first()
        )
        if written is not None:
            return tuple(written)
    if not ChatSession.objects.filter(pk=session.pk).exists():
        raise ChatSession.DoesNotExist("The session was deleted while its turn ran.")
    if Turn.objects.filter(pk=turn.pk).exists():
        raise TurnLockLost("This turn was finished by another request while this one waited; nothing was written.")
    raise Turn.DoesNotExist("The turn was deleted while it ran.")


def after_turn(
    turn: Turn, session: ChatSession, *, history: TurnHistory | None = None, finished: TurnText | None = None
) -> None:
    """Enqueue the background work of a finished turn. A broker outage is logged; the turn is already saved.

    Runs right after the completing transaction commits, with the caller's objects: the session (and
    its agent) as the runtime holds them; ``summary_request_if_due`` compares-and-sets in the database.
    With the history the turn read and the turn as finished, the summary check reads no turns again.
    """
    try:
        memory_writes_enqueue(turn=turn)
    except Exception:
        logger.exception("could not enqueue memory writes for turn %s", turn.pk)
    try:
        summary_request_if_due(session=session, history=history, finished=finished)
    except Exception:
        logger.exception("could not request a summary for session %s", session.pk)


def fail_turn(session: ChatSession, turn: Turn, *, reason: str, reply: str, summary: str | None = None) -> bool:
    """Mark the turn failed. ``reason`` (the exception's text) is for staff, in ``Turn.error`` and the log;
    ``summary`` goes into the checkpoint log, which the session's owner reads through the API. False when
    the turn was finished elsewhere meanwhile (or deleted): nothing is written."""
    failed = {"status": Turn.Status.FAILED, "error": reason[:4000], "assistant_message": reply}
    if not write_unfinished(turn, completed_at=timezone.now(), **failed):
        # Finished elsewhere (see finish_turn_row), or deleted with its session: nothing of ours to record.
        logger.warning("turn %s failed after it was finished elsewhere or deleted; not recorded", turn.pk)
        return False
    turn.refresh_from_db()
    try:
        turn_failure_record(session=session, turn=turn, reason=(summary or reason)[:500])
    except Exception:
        logger.exception("could not record the failure of turn %s", turn.pk)
    return True
