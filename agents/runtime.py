"""The turn loop: one user message in, one reply out, with nothing lost on the way.

The order, and why (the contracts are in docs/internals.md, "The turn"):

1. ``turn_begin`` (``agents.turn.begin``): validate the message, take the session's turn lock, honour
   ``Idempotency-Key``, save the message as a ``Turn`` (status running) and a ``before_call`` checkpoint,
   and commit — before any model call, so a crash never loses the message.
2. The pipeline (``PIPELINE``) over a ``TurnContext``: refuse if the agent is off, stop if handed off,
   retrieve memories, decide the workflow step (structured, validated, checkpointed), route, reply with
   tools under a hard step limit (``agents.turn.steps``, ``agents.turn.reply``).
3. Save the reply and the context composition; enqueue memory writes and summarization after commit
   (``agents.turn.finish``).

**One turn at a time per session** (``sessions.locks``). A second request waits up to
``TURN_LOCK_WAIT_SECONDS`` and then gets ``SessionBusyError`` (HTTP 409). If the process running a turn
dies, PostgreSQL releases its lock: a turn found ``running`` while its lock is free was orphaned by a
crash, and the next request (or the sweep beat runs every minute) resumes it from its checkpoint, once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db.models import Case, F, Func, JSONField, QuerySet, TextField, Value, When
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from agents.call_records import llm_calls_held
from agents.llm.base import LLMError, TruncatedOutputError
from agents.llm.prompt import ContextOverflowError
from agents.llm.providers import get_provider
from agents.llm.tokens import counter_for
from agents.turn.begin import (
    MessageRejected,
    SessionClosedError,
    TurnHandle,
    turn_begin,
    validate_message,
)
from agents.turn.context import (
    AGENT_SWITCHED_OFF,
    FINISHED,
    HANDOFF_NOTICE,
    UNFINISHED,
    TurnContext,
    TurnEvent,
    done_event,
    error_event,
    reload_session,
    state_event,
)
from agents.turn.finish import fail_turn
from agents.turn.reply import reply
from agents.turn.steps import (
    act,
    decide,
    describe,
    error_code,
    hand_off_if_the_workflow_says,
    refuse_if_switched_off,
    retrieve,
    route,
    stop_if_handed_off,
)
from agents.workflows import get_workflow
from config.queue import enqueue
from config.services import requeue_each
from observability.logging import log_context
from observability.tracing import span
from sessions.locks import SessionTurnLock, TurnLockLost
from sessions.models import ChatSession, Checkpoint, Turn, staff_signed
from sessions.services import checkpoint_record, stuck_turns_find

__all__ = [
    "AGENT_SWITCHED_OFF",
    "HANDOFF_NOTICE",
    "PIPELINE",
    "MessageRejected",
    "SessionClosedError",
    "TurnHandle",
    "TurnResult",
    "TurnStream",
    "handoff_reply",
    "handoff_request",
    "handoff_resume",
    "stuck_turns_enqueue",
    "stuck_turns_recover",
    "turn_begin",
    "turn_events",
    "turn_recover",
    "turn_run",
    "turn_stream",
    "validate_message",
]

logger = logging.getLogger(__name__)

# The steps of every turn, in order; a step that ends the turn (refused, handed off, answered) sets ctx.done.
PIPELINE: tuple[Callable[[TurnContext], Iterator[TurnEvent]], ...] = (
    refuse_if_switched_off,
    stop_if_handed_off,
    retrieve,
    decide,
    act,
    hand_off_if_the_workflow_says,
    route,
    reply,
)


@dataclass
class TurnResult:
    turn: Turn
    reply: str
    replayed: bool = False
    is_demo: bool = False
    recovered: list[Turn] = field(default_factory=list)


def turn_events(handle: TurnHandle) -> Generator[TurnEvent, None, None]:
    """Run an accepted turn, yielding events; always releases the session lock at the end."""
    if handle.replay is not None:
        yield from _replay_events(handle.replay)
        return
    assert handle.turn is not None and handle.lock is not None
    try:
        for orphan in handle.orphans:
            recovered = _drain(_execute(handle.session, orphan, resumed=True))
            yield {"type": "recovered", "turn_id": orphan.pk, "seq": orphan.seq, "reply": recovered.get("reply", "")}
        # turn_begin read the session under the lock; orphans run before this turn change it.
        yield from _execute(
            handle.session,
            handle.turn,
            resumed=handle.resumed,
            fresh=not handle.orphans,
            checkpoint_fresh=handle.checkpoint_fresh and not handle.orphans,
        )
    finally:
        handle.lock.release()


class TurnStream:
    """A turn's events (``turn_events``) whose ``close()`` always lets the session's lock go.

    A plain generator closed before it started runs no ``finally``: a server that fails to send the
    first bytes (the client is gone) and closes the response would leave the lock held by this thread's
    connection, and the session busy until that connection closed. Closing this releases it whatever
    state the events are in; a turn cut short stays saved, for the next request or the sweep to finish.
    (The SSE response runs the remaining events before it closes this: ``sessions.streaming``.)
    """

    def __init__(self, handle: TurnHandle) -> None:
        self._handle = handle
        self._events = turn_events(handle)

    def __iter__(self) -> TurnStream:
        return self

    def __next__(self) -> TurnEvent:
        return next(self._events)

    def close(self) -> None:
        try:
            self._events.close()
        finally:
            if self._handle.lock is not None:
                self._handle.lock.release()  # a no-op when turn_events released it already


def turn_stream(
    *, session: ChatSession, message: str, idempotency_key: str | None = None, wait_seconds: float | None = None
) -> TurnStream:
    """``turn_begin`` then ``turn_events``: validation and busy errors raise before the first event."""
    handle = turn_begin(session=session, message=message, idempotency_key=idempotency_key, wait_seconds=wait_seconds)
    return TurnStream(handle)


def turn_run(
    *, session: ChatSession, message: str, idempotency_key: str | None = None, wait_seconds: float | None = None
) -> TurnResult:
    """Run one turn to the end and return its saved result."""
    handle = turn_begin(session=session, message=message, idempotency_key=idempotency_key, wait_seconds=wait_seconds)
    if handle.replay is not None:
        return TurnResult(
            turn=handle.replay, reply=handle.replay.assistant_message, replayed=True, is_demo=handle.replay.is_demo
        )
    recovered = [Turn.objects.get(pk=event["turn_id"]) for event in turn_events(handle) if event["type"] == "recovered"]
    turn = handle.turn
    assert turn is not None
    # The saved row is the outcome (completed or failed); the events only mirror it. Every ending of
    # the turn re-reads it; one that did not (the lock was lost to another process) is read here.
    if turn.status not in FINISHED:
        turn = Turn.objects.get(pk=turn.pk)
    return TurnResult(turn=turn, reply=turn.assistant_message, is_demo=turn.is_demo, recovered=recovered)


def turn_recover(*, turn_id: int) -> bool:
    """Finish a turn whose process died mid-call. Returns False when it is running elsewhere or already done."""
    turn = Turn.objects.select_related("session").filter(pk=turn_id).first()
    if turn is None or turn.status not in UNFINISHED:
        return False
    lock = SessionTurnLock(turn.session_id)
    if not lock.try_acquire():
        return False  # alive: its owner still holds the lock
    try:
        turn.refresh_from_db()
        if turn.status not in UNFINISHED:
            return False
        _drain(_execute(turn.session, turn, resumed=True))
        return True
    finally:
        lock.release()


def stuck_turns_recover(*, older_than: timedelta | None = None) -> int:
    """Resume every orphaned turn older than ``older_than`` here, one after another. Returns how many.
    (The periodic sweep sends each to its own task instead: ``stuck_turns_enqueue``.)"""
    count = 0
    for turn in _stuck(older_than):
        try:
            if turn_recover(turn_id=turn.pk):
                count += 1
        except Exception:  # one broken session must not stop the sweep
            logger.exception("could not recover turn %s", turn.pk)
    return count


# A recovery task's own time limit is sized for one turn (``agents.tasks.recover_turn``); a sweep does not
# send the same turn again within this window, while its task may still be queued or running.
RECOVERY_RESEND_AFTER = timedelta(minutes=20)


def stuck_turns_enqueue(*, older_than: timedelta | None = None, limit: int = 200) -> int:
    """The periodic sweep: send each orphaned turn older than ``older_than`` to a recovery task of its own
    (at most ``limit``, not one sent within ``RECOVERY_RESEND_AFTER``). Returns how many were sent.

    One task for all of them had one time limit for all: after a crash with many turns to finish, it cut
    the turn it was answering short, and that turn failed; the ones after it waited for the next sweep."""
    turn_ids = list(_stuck(older_than).values_list("pk", flat=True)[: limit * 4])
    sent = requeue_each(
        "turn-recovery",
        ((turn_id, partial(enqueue, "agents.tasks.recover_turn", turn_id)) for turn_id in turn_ids),
        within=RECOVERY_RESEND_AFTER,
        limit=limit,
    )
    if sent:
        logger.info("sent %s stuck turn(s) to recovery", sent)
    return sent


def _stuck(older_than: timedelta | None) -> QuerySet[Turn]:
    age = older_than if older_than is not None else timedelta(seconds=int(getattr(settings, "STUCK_TURN_SECONDS", 120)))
    return stuck_turns_find(older_than=age)


def handoff_reply(*, session: ChatSession, text: str, author: Any) -> Turn:
    """A person answers a session that was handed to a human; the reply is added to the latest turn (its text,
    and its list of staff replies, which the chat shows apart and live)."""
    text = validate_message(text)
    turn = session.turns.order_by("-seq").first()
    if turn is None:
        raise MessageRejected("no_turn", "This session has no message to answer yet.")
    reply = {"author": author.get_username(), "text": text, "at": timezone.now().isoformat()}
    signed = staff_signed(reply)
    # Appended in the database, in one statement: two staff replying at once both land (a read-modify-write
    # of the text kept only the last one).
    Turn.objects.filter(pk=turn.pk).update(
        assistant_message=Case(
            When(assistant_message="", then=Value(signed)),
            default=Concat(F("assistant_message"), Value("\n\n" + signed)),
            output_field=TextField(),
        ),
        staff_replies=Func(
            F("staff_replies"),
            Cast(Value(json.dumps([reply])), JSONField()),
            template="%(expressions)s",
            arg_joiner=" || ",
        ),
    )
    ChatSession.objects.filter(pk=session.pk).update(updated_at=timezone.now())
    turn.refresh_from_db(fields=["assistant_message", "staff_replies"])
    return turn


def handoff_request(*, session: ChatSession, actor: Any = None, reason: str = "") -> bool:
    """Staff hand a session to a person: the agent stops answering it until it is handed back. False when it
    was with a person already."""
    changed = (
        ChatSession.objects.filter(pk=session.pk)
        .exclude(status=ChatSession.Status.NEEDS_HUMAN)
        .update(status=ChatSession.Status.NEEDS_HUMAN, version=F("version") + 1, updated_at=timezone.now())
    )
    reload_session(session)
    if changed:
        detail = f"handed to a person by {actor or 'staff'}" + (f": {reason}" if reason else "")
        checkpoint_record(session=session, reason=Checkpoint.Reason.HANDOFF, detail=detail[:500])
    return bool(changed)


def handoff_resume(*, session: ChatSession, actor: Any = None) -> ChatSession:
    """Give a handed-off session back to the agent."""
    ChatSession.objects.filter(pk=session.pk).update(
        status=ChatSession.Status.ACTIVE, retry_count=0, version=F("version") + 1, updated_at=timezone.now()
    )
    reload_session(session)
    checkpoint_record(session=session, reason=Checkpoint.Reason.RESUME, detail=f"handoff resumed by {actor or 'staff'}")
    return session


# --------------------------------------------------------------------------------------------------
# Running a saved turn
# --------------------------------------------------------------------------------------------------


def _execute(
    session: ChatSession, turn: Turn, *, resumed: bool, fresh: bool = False, checkpoint_fresh: bool = False
) -> Iterator[TurnEvent]:
    """Run a saved turn to completion. Every failure is caught, recorded on the turn, and reported as an event."""
    with (
        log_context(session_id=str(session.pk), turn_id=turn.pk),
        span("turn", session_id=str(session.pk), turn_id=turn.pk),
    ):
        yield {"type": "turn", "turn_id": turn.pk, "seq": turn.seq, "resumed": resumed}
        with llm_calls_held(turn.pk):
            yield from _run_pipeline(session, turn, fresh=fresh, checkpoint_fresh=checkpoint_fresh, resumed=resumed)


def _run_pipeline(
    session: ChatSession, turn: Turn, *, fresh: bool, checkpoint_fresh: bool, resumed: bool
) -> Iterator[TurnEvent]:
    """The steps of ``PIPELINE`` over a new ``TurnContext``, until one ends the turn; a failure fails the turn."""
    try:
        if not fresh:
            reload_session(session)
        agent = session.agent
        provider = get_provider(agent=agent)
        ctx = TurnContext(
            session=session,
            turn=turn,
            agent=agent,
            provider=provider,
            workflow=get_workflow(session.workflow, session.workflow_version),
            counter=counter_for(provider.model),
            checkpoint_fresh=checkpoint_fresh,
            resumed=resumed,
        )
        for step in PIPELINE:
            yield from step(ctx)
            if ctx.done:
                break
    except TurnLockLost as exc:
        # Another process owns this turn now; writing anything would duplicate its reply.
        logger.warning("turn %s: %s", turn.pk, exc)
        yield error_event(exc.code, str(exc), turn)
    except Exception as exc:  # the turn fails cleanly; the message stays saved
        logger.exception("turn %s failed", turn.pk)
        message = _user_facing_error(exc)
        recorded = fail_turn(session, turn, reason=f"{type(exc).__name__}: {exc}", reply=message, summary=describe(exc))
        if not recorded and Turn.objects.filter(pk=turn.pk).exists():
            # Another request finished this turn while this one failed: its reply stands.
            lost = TurnLockLost("This turn was finished by another request; its reply stands.")
            yield error_event(lost.code, str(lost), turn)
            return
        try:
            reload_session(session)
        except ChatSession.DoesNotExist:
            pass  # deleted while its turn ran: the error event below is all there is left to say
        yield error_event(getattr(exc, "code", None) or error_code(exc), message, turn)


def _user_facing_error(exc: Exception) -> str:
    if isinstance(exc, TruncatedOutputError):
        return "The model's reply was cut off before it finished, so it was not used. Your message is saved; please try again."
    if isinstance(exc, LLMError):
        return f"The model could not answer ({exc.outcome.replace('_', ' ')}). Your message is saved; please try again."
    if isinstance(exc, ContextOverflowError):
        return "This message does not fit in the model's context window even after trimming. Please shorten it."
    return "Something went wrong while answering. Your message is saved; please try again."


def _drain(events: Iterator[TurnEvent]) -> TurnEvent:
    final: TurnEvent = {}
    for event in events:
        if event["type"] in ("done", "error"):
            final = event
    return final


def _replay_events(turn: Turn) -> Iterator[TurnEvent]:
    yield {"type": "turn", "turn_id": turn.pk, "seq": turn.seq, "replayed": True}
    if turn.assistant_message:
        yield {"type": "delta", "text": turn.assistant_message}
    session = turn.session
    yield state_event(session)
    yield done_event(turn, session, replayed=True)
