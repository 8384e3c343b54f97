"""Running an accepted turn, here: the steps of ``PIPELINE`` over a ``TurnContext``, yielded as events.

``turn_events`` runs a turn that ``turn_begin`` accepted (its orphans first, each resumed from its checkpoint)
and always lets the session's lock go; ``TurnStream`` wraps them so that closing it lets the lock go too.
``saved_turn_events`` runs one saved turn to its end: every failure is caught, recorded on the turn and
reported as an event (the recovery of a lost turn runs it too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator

from agents.call_records import llm_calls_held
from agents.workflows import get_workflow
from core import events as run_channel
from llm.base import LLMError, TruncatedOutputError
from llm.prompt import ContextOverflowError
from llm.providers import get_provider
from llm.tokens import counter_for
from observability.logging import log_context
from observability.tracing import span
from orchestrator.begin import TurnHandle, session_unavailable
from orchestrator.context import (
    TurnContext,
    TurnEvent,
    done_event,
    error_event,
    reload_session,
    state_event,
)
from orchestrator.decided import decide_in_reply
from orchestrator.finish import fail_turn, refuse_turn
from orchestrator.reply import reply
from orchestrator.steps import (
    act,
    decide,
    describe,
    error_code,
    hand_off_if_the_workflow_says,
    retrieve,
    route,
    stop_if_handed_off,
)
from sessions.locks import TurnLockLost
from sessions.models import ChatSession, Turn

logger = logging.getLogger(__name__)

# The steps of every turn, in order; a step that ends the turn (refused, handed off, answered) sets ctx.done.
PIPELINE: tuple[Callable[[TurnContext], Iterator[TurnEvent]], ...] = (
    stop_if_handed_off,
    retrieve,
    decide_in_reply,
    decide,
    act,
    hand_off_if_the_workflow_says,
    route,
    reply,
)


def turn_events(handle: TurnHandle) -> Generator[TurnEvent, None, None]:
    """Run an accepted turn, yielding events; always releases the session lock at the end."""
    if handle.replay is not None:
        yield from _replay_events(handle.replay)
        return
    assert handle.turn is not None and handle.lock is not None
    try:
        for orphan in handle.orphans:
            recovered = _drain(saved_turn_events(handle.session, orphan, resumed=True))
            yield {"type": "recovered", "turn_id": orphan.pk, "seq": orphan.seq, "reply": recovered.get("reply", "")}
        # turn_begin read the session under the lock; orphans run before this turn change it.
        yield from saved_turn_events(
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
    (The SSE response runs the remaining events before it closes this: ``web.chat.streaming``.)
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


def saved_turn_events(
    session: ChatSession, turn: Turn, *, resumed: bool, fresh: bool = False, checkpoint_fresh: bool = False
) -> Iterator[TurnEvent]:
    """Run a saved turn to completion. Every failure is caught, recorded on the turn, and reported as an event."""
    with (
        log_context(session_id=str(session.pk), turn_id=turn.pk),
        span("turn", session_id=str(session.pk), turn_id=turn.pk),
    ):
        yield {"type": "turn", "turn_id": turn.pk, "seq": turn.seq, "resumed": resumed}
        # Its other open pages draw the message now and follow the reply (web.chat.events: turn_started).
        run_channel.session_changed(session.pk)
        with llm_calls_held(turn.pk):
            yield from _run_pipeline(session, turn, fresh=fresh, checkpoint_fresh=checkpoint_fresh, resumed=resumed)
        # The session's other open pages (another tab, a turn sent through the API) show it without polling.
        run_channel.session_changed(session.pk)


def _run_pipeline(
    session: ChatSession, turn: Turn, *, fresh: bool, checkpoint_fresh: bool, resumed: bool
) -> Iterator[TurnEvent]:
    """The steps of ``PIPELINE`` over a new ``TurnContext``, until one ends the turn; a failure fails the turn."""
    try:
        if not fresh:
            reload_session(session)
        unavailable = session_unavailable(session)
        if unavailable is not None:
            # Switched off, or its workflow gone, after this message was saved (a turn the sweep or a retry
            # resumes): kept, not answered, and said so; restoring the agent lets the next message be answered.
            note = unavailable + " This message was saved but will not be answered."
            refuse_turn(session, turn, note=note)
            yield error_event("agent_unavailable", note, turn)
            return
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
