"""A turn's outcome, the only place it is written, always through the fence (a turn finished once is never
written again): completed (with its after-work enqueued), failed, refused (its agent switched off), kept for
the person a session was handed to, handed off by this turn, or stopped at the step limit."""

from __future__ import annotations

import functools
import json
import logging
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from agents.call_records import llm_calls_give_back, llm_calls_json, llm_calls_take
from core.db import reconnect_if_broken
from llm.prompt import TurnText
from memory.services import memory_writes_enqueue
from orchestrator.context import HANDOFF_NOTICE
from sessions.locks import TurnLockLost, lease_of
from sessions.models import ChatSession, Turn
from sessions.services import (
    CompleteWrite,
    session_hand_off,
    turn_complete_write,
    turn_failure_record,
    turn_write_unfinished,
)
from sessions.summaries import summary_request_if_due

if TYPE_CHECKING:
    from sessions.context import TurnHistory

logger = logging.getLogger(__name__)


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


def _complete(
    session: ChatSession,
    turn: Turn,
    fields: dict[str, Any],
    *,
    calls: list[Any],
    resets_failures: bool,
    now: Any,
) -> tuple[Any, ...]:
    """``turn_complete_write`` under this process's lease; once more after a cut connection (reconnected, the
    lease retaken if free). The session's row as written; ``TurnLockLost`` when another runner has the turn."""
    lock = lease_of(session.pk)
    if lock is None:
        raise TurnLockLost("This turn's lease is not held here; another runner is finishing it. Nothing was written.")
    write = functools.partial(
        turn_complete_write,
        session_id=session.pk,
        turn_id=turn.pk,
        fields=fields,
        calls_json=llm_calls_json(calls),
        resets_failures=resets_failures,
        now=now,
    )
    cut = False
    for attempt in (1, 2):
        try:
            written = write(lease_owner=lock.owner)
        except (OperationalError, InterfaceError):
            # Cut while the model answered (or while this statement's answer came back): reconnect, take the
            # lease again if it is free, and try once more.
            if attempt == 2 or not reconnect_if_broken():
                raise
            cut, written = True, CompleteWrite(held=False, completed=False)
        if written.completed:
            return written.session_row
        if written.held:
            break
        # The lease is not ours (it ran out, or was taken over): retake it when it is free.
        if attempt == 2 or not lock.holds_or_retakes():
            raise TurnLockLost("The database connection was lost mid-turn and another request is finishing this turn.")
    return _completed_elsewhere(session, turn, cut=cut, now=now)


def _completed_elsewhere(session: ChatSession, turn: Turn, *, cut: bool, now: Any) -> tuple[Any, ...]:
    """Nothing was completed by the last attempt: the first one's, committed before its answer was lost with
    the connection (done, as written), or why not (``TurnLockLost``, or the session or turn deleted)."""
    if cut and Turn.objects.filter(pk=turn.pk, status=Turn.Status.COMPLETED, completed_at=now).exists():
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
    if not turn_write_unfinished(turn=turn, completed_at=timezone.now(), **failed):
        # Finished elsewhere (the fence: turn_write_unfinished), or deleted with its session: nothing of ours to record.
        logger.warning("turn %s failed after it was finished elsewhere or deleted; not recorded", turn.pk)
        return False
    turn.refresh_from_db()
    try:
        turn_failure_record(session=session, turn=turn, reason=(summary or reason)[:500])
    except Exception:
        logger.exception("could not record the failure of turn %s", turn.pk)
    return True


def refuse_turn(session: ChatSession, turn: Turn, *, note: str) -> None:
    """Its agent was switched off after the message was saved: failed, with ``note`` for the user."""
    _finish_row(
        turn,
        status=Turn.Status.FAILED,
        error="agent switched off",
        assistant_message=note,
        completed_at=timezone.now(),
        state_after=session.state,
    )
    turn.refresh_from_db()


def keep_for_person(session: ChatSession, turn: Turn) -> None:
    """The session is with a person: the message is kept for them, unanswered (the turn completes empty)."""
    _finish_row(turn, status=Turn.Status.COMPLETED, completed_at=timezone.now(), state_after=session.state)
    turn.refresh_from_db()


def hand_off_turn(session: ChatSession, turn: Turn, *, reason: str, said: str = "") -> str:
    """This turn hands the session to a person: answered with the hand-off notice (after what the model ``said``
    first), the session handed off (``sessions.services.session_hand_off``), in one transaction. The reply."""
    reply = f"{said.strip()}\n\n{HANDOFF_NOTICE}" if said.strip() else HANDOFF_NOTICE
    with transaction.atomic():
        # The turn first: a runner that lost the turn to another changes nothing.
        _finish_row(turn, status=Turn.Status.COMPLETED, assistant_message=reply, completed_at=timezone.now())
        session_hand_off(session=session, turn=turn, detail=reason)
    turn.refresh_from_db()
    return reply


def mark_step_limit(turn: Turn, *, limit: int) -> None:
    """The turn reached its step limit (what follows is a partial reply, a hand-off or a failure)."""
    turn_write_unfinished(turn=turn, step_limit_hit=True, steps=limit)


def _finish_row(turn: Turn, **fields: Any) -> None:
    """Write a turn's outcome through the fence; ``TurnLockLost`` when it was shut (finished by another runner)."""
    if not turn_write_unfinished(turn=turn, **fields):
        raise TurnLockLost("This turn was finished by another request while this one waited; nothing was written.")
