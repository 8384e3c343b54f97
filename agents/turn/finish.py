"""A turn's outcome, saved through the fence: completed (with its after-work enqueued) or failed."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Case, F, PositiveIntegerField, When
from django.utils import timezone

from agents.llm.prompt import TurnText
from agents.turn.context import UNFINISHED, write_unfinished
from config.db import refresh_from, update_returning
from memory.services import memory_writes_enqueue
from sessions.locks import SessionTurnLock, TurnLockLost
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
    """Save the reply in one transaction; after the commit, enqueue the turn's background work. ``history``
    is what the turn's prompt was built from, if it was. ``resets_failures``: a workflow with nothing to
    decide (free chat) has no transition to reset its failure count, so a turn that succeeds does."""
    if not SessionTurnLock(session.pk).holds_or_retakes():
        raise TurnLockLost("The database connection was lost mid-turn and another request is finishing this turn.")
    now = timezone.now()
    with transaction.atomic():
        session_fields: dict[str, Any] = {"updated_at": now}
        if resets_failures:
            # A change of state, so the version moves when there was a count to reset.
            session_fields["retry_count"] = 0
            session_fields["version"] = Case(
                When(retry_count__gt=0, then=F("version") + 1),
                default=F("version"),
                output_field=PositiveIntegerField(),
            )
        # The session row is locked from here to the commit; the turn records the state it returned.
        stored = update_returning(ChatSession.objects.filter(pk=session.pk), **session_fields)
        if not stored:
            raise ChatSession.DoesNotExist("The session was deleted while its turn ran.")
        fields: dict[str, Any] = {
            "status": Turn.Status.COMPLETED,
            "assistant_message": reply,
            "steps": steps,
            "retrieval": retrieval,
            "prompt_tokens": prompt_tokens,
            "completed_at": now,
            "state_after": stored[0].state,
            "error": "",
        }
        if composition:
            fields["composition"] = composition
        if is_demo:
            fields["is_demo"] = True
        if truncated:
            fields["truncated"] = True
        saved = update_returning(Turn.objects.filter(pk=turn.pk, status__in=UNFINISHED), **fields)
        if not saved:
            # Rolls the session's write back with it (see finish_turn_row).
            if Turn.objects.filter(pk=turn.pk).exists():
                raise TurnLockLost(
                    "This turn was finished by another request while this one waited; nothing was written."
                )
            raise Turn.DoesNotExist("The turn was deleted while it ran.")
        finished = TurnText(seq=turn.seq, user=turn.user_message, assistant=reply)
        transaction.on_commit(lambda: after_turn(turn, session, history=history, finished=finished))
    # Committed: both rows as written, with no re-read (the session keeps its agent and user). Not before
    # the commit, so a commit that fails leaves the caller's copies as the database has them.
    refresh_from(session, stored[0])
    refresh_from(turn, saved[0])


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
