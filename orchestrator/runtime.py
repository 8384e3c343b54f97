"""The turn loop: one user message in, one reply out, with nothing lost on the way.

The order, and why (the contracts are in docs/internals.md, "The turn"):

1. ``turn_begin`` (``orchestrator.begin``): validate the message, take the session's turn lock, honour
   ``Idempotency-Key``, save the message as a ``Turn`` (status running) and a ``before_call`` checkpoint,
   and commit — before any model call, so a crash never loses the message.
2. The pipeline (``PIPELINE``) over a ``TurnContext``: refuse if the agent is off, stop if handed off,
   retrieve memories, decide the workflow step (structured, validated, checkpointed), route, reply with
   tools under a hard step limit (``orchestrator.steps``, ``orchestrator.reply``).
3. Save the reply and the context composition; enqueue memory writes and summarization after commit
   (``orchestrator.finish``).

**One turn at a time per session** (``sessions.locks``). A second request waits up to
``TURN_LOCK_WAIT_SECONDS`` and then gets ``SessionBusyError`` (HTTP 409). If the process running a turn
dies, PostgreSQL releases its lock: a turn found ``running`` while its lock is free was orphaned by a
crash, and the next request (or the sweep beat runs every minute) resumes it from its checkpoint, once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from agents.call_records import llm_calls_held
from agents.workflows import get_workflow
from core import events as run_channel
from core.db import release_connection
from core.errors import Refusal
from core.queue import enqueue, queued_args
from core.services import requeue_each
from llm.base import LLMError, TruncatedOutputError
from llm.prompt import ContextOverflowError
from llm.providers import get_provider
from llm.tokens import counter_for
from observability.logging import log_context
from observability.tracing import span
from orchestrator.begin import (
    MessageRejected,
    SessionClosedError,
    TurnHandle,
    turn_begin,
    turn_in_flight,
    validate_message,
)
from orchestrator.context import (
    AGENT_SWITCHED_OFF,
    FINISHED,
    HANDOFF_NOTICE,
    UNFINISHED,
    TurnContext,
    TurnEvent,
    done_event,
    error_event,
    release_connection_before_model_calls,
    reload_session,
    state_event,
)
from orchestrator.finish import fail_turn
from orchestrator.reply import reply
from orchestrator.steps import (
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
from sessions.locks import SessionTurnLock, TurnLockLost, lease_let_go, unclaimed_leases_let_go
from sessions.models import ChatSession, Turn, staff_signed
from sessions.selectors import orphaned_turns_find, unclaimed_lease_owners
from sessions.services import session_hand_back, session_hand_off, turn_staff_reply_append

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


def turn_stream(
    *, session: ChatSession, message: str, idempotency_key: str | None = None, wait_seconds: float | None = None
) -> TurnStream | RunStream:
    """``turn_begin``, then the turn's events: run here (``TurnStream``), or by a turn worker and read from the run
    channel (``RunStream``, see ``turn_runner``). Validation and busy errors raise before the first event, and so
    does ``TurnsQueueFull`` (back-pressure), before anything is saved."""
    if turn_runner() == "worker":
        running = turn_in_flight(session=session, message=message, idempotency_key=idempotency_key)
        if running is not None:
            return RunStream(running)  # a retry of a message whose turn runs: its events, from the start
    turns_queue_check()
    handle = turn_begin(session=session, message=message, idempotency_key=idempotency_key, wait_seconds=wait_seconds)
    if handle.replay is None and turn_runner() == "worker":
        run = turn_submit(handle)
        if run is not None:
            return run
    return TurnStream(handle)


def turn_run(
    *, session: ChatSession, message: str, idempotency_key: str | None = None, wait_seconds: float | None = None
) -> TurnResult:
    """Run one turn to the end (here, or on a turn worker while this waits) and return its saved result. A retry of
    a message whose turn still runs (the same ``Idempotency-Key``) waits for that turn's end."""
    if turn_runner() == "worker":
        running = turn_in_flight(session=session, message=message, idempotency_key=idempotency_key)
        if running is not None:
            for _ in RunStream(running):
                pass
            running.refresh_from_db()
            return TurnResult(turn=running, reply=running.assistant_message, replayed=True, is_demo=running.is_demo)
    turns_queue_check()
    handle = turn_begin(session=session, message=message, idempotency_key=idempotency_key, wait_seconds=wait_seconds)
    if handle.replay is not None:
        return TurnResult(
            turn=handle.replay, reply=handle.replay.assistant_message, replayed=True, is_demo=handle.replay.is_demo
        )
    run = turn_submit(handle) if turn_runner() == "worker" else None
    events: Iterator[TurnEvent] = run if run is not None else turn_events(handle)
    recovered = [Turn.objects.get(pk=event["turn_id"]) for event in events if event["type"] == "recovered"]
    turn = handle.turn
    assert turn is not None
    # The saved row is the outcome (completed or failed); the events only mirror it. Every ending of
    # the turn re-reads it; one that did not (the lock was lost to another process) is read here.
    if turn.status not in FINISHED:
        turn = Turn.objects.get(pk=turn.pk)
    return TurnResult(turn=turn, reply=turn.assistant_message, is_demo=turn.is_demo, recovered=recovered)


# --------------------------------------------------------------------------------------------------
# Turns run by a turn worker: accepted here, executed there, their events read from the run channel
# --------------------------------------------------------------------------------------------------


def turn_runner() -> str:
    """Where accepted turns run: ``"worker"`` (a turn worker, events through the run channel) when
    ``TURN_RUNNER`` says so and there is a channel and a broker to send to; else ``"inline"`` (in the request)."""
    wanted = str(getattr(settings, "TURN_RUNNER", "inline"))
    if wanted != "worker" or getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False) or run_channel.channel_url() is None:
        return "inline"
    return "worker"


class TurnsQueueFull(Refusal):
    """More turns wait for a turn worker than ``TURN_QUEUE_LIMIT``: refused before anything is saved."""

    code = "busy"
    status = 503
    default_message = "Too many messages are waiting to be answered right now; nothing was saved. Try again shortly."
    retry_after = 5


def turns_queue_name() -> str:
    return f"{settings.CELERY_TASK_DEFAULT_QUEUE}-turns"


def turns_queue_check() -> None:
    """Back-pressure: ``TurnsQueueFull`` when more turns wait for a worker than ``TURN_QUEUE_LIMIT`` (0: no limit).
    A broker that cannot be read is not a reason to refuse (the send will say)."""
    limit = int(getattr(settings, "TURN_QUEUE_LIMIT", 0))
    if not limit or turn_runner() != "worker":
        return
    try:
        waiting = run_channel.backlog(turns_queue_name())
    except Exception:
        logger.warning("could not read the turns queue's length", exc_info=True)
        return
    if waiting is not None and waiting >= limit:
        raise TurnsQueueFull()


RUN_TURN_TASK = "agents.tasks.run_turn"


def turn_submit(handle: TurnHandle) -> RunStream | None:
    """Send an accepted turn to a turn worker, handing it the session's lease; its events follow on the run
    channel. None when it could not be sent (the broker refused): the caller runs it here, still holding the lease."""
    assert handle.turn is not None and handle.lock is not None
    turn, lock = handle.turn, handle.lock
    owner = lock.hand_over(seconds=float(getattr(settings, "TURN_QUEUE_SECONDS", 300)))
    try:
        enqueue(
            RUN_TURN_TASK,
            turn.pk,
            owner,
            [orphan.pk for orphan in handle.orphans],
            handle.resumed,
            handle.checkpoint_fresh,
        )
    except Exception:
        logger.exception("could not send turn %s to a turn worker; answering it in this process", turn.pk)
        if lock.try_acquire():  # ours still (the same owner): nobody could take it meanwhile
            return None
        raise
    return RunStream(turn)


def turn_execute(*, turn_id: int, owner: str, orphan_ids: list[int], resumed: bool, checkpoint_fresh: bool) -> str:
    """A turn worker runs a submitted turn under the lease it was handed, publishing each event on the run
    channel. Returns what became of it: "ran", "finished" (done elsewhere: its saved end is published) or
    "taken" (someone else runs it now; they publish)."""
    try:
        turn = Turn.objects.select_related("session__agent", "session__user").filter(pk=turn_id).first()
        if turn is None:
            run_channel.publish(turn_id, {"type": "error", "code": "not_found", "message": "This turn was deleted."})
            return "finished"
        if turn.status in FINISHED:
            _end_published(turn)
            return "finished"
        # Claimed under an owner of this run's own: a second delivery of this task (the broker's, after a
        # visibility timeout) cannot take the lease while this run holds it.
        lock = SessionTurnLock(turn.session_id)
        if not lock.claim(owner):
            return "taken"
    except Exception:
        # The task failed before it picked its turn up (the database did not answer, ...): the hand-over is let
        # go, so the sweep resumes the turn at its next pass, not when the hand-over would have run out.
        logger.exception("turn %s: its task failed before it picked the turn up; leaving it to the sweep", turn_id)
        with contextlib.suppress(Exception):
            lease_let_go(owner)
        release_connection()
        raise
    turn.refresh_from_db()
    if turn.status in FINISHED:  # finished by someone else between the read and the claim
        lock.release()
        _end_published(turn)
        return "finished"
    session = turn.session
    orphans = list(Turn.objects.filter(pk__in=orphan_ids, status__in=UNFINISHED).order_by("seq"))
    handle = TurnHandle(
        session=session, turn=turn, lock=lock, orphans=orphans, resumed=resumed, checkpoint_fresh=checkpoint_fresh
    )
    with connections_released_while_models_answer():
        for event in turn_events(handle):
            run_channel.publish(turn_id, event)
    return "ran"


def _end_published(turn: Turn) -> None:
    """Publish a finished turn's end for its followers, unless its run already ended on the channel (a second
    delivery of its task must not add a second end)."""
    if not run_channel.exists(turn.pk):
        run_channel.publish(turn.pk, turn_end_event(turn))


def _publish_quietly(run: int, event: TurnEvent) -> None:
    """Publish on the run channel; a channel that fails costs its followers the live events (they end from the
    database), never the turn."""
    try:
        run_channel.publish(run, event)
    except Exception:
        logger.warning("could not publish an event of turn %s on the run channel", run, exc_info=True)


def turn_end_event(turn: Turn) -> TurnEvent:
    """The final event of a finished turn, from what is saved: its ``done`` (or ``error`` when it failed)."""
    session = ChatSession.objects.get(pk=turn.session_id)
    if turn.status == Turn.Status.FAILED:
        return error_event("turn_failed", turn.assistant_message or "This turn failed.", turn)
    return done_event(turn, session)


class RunStream:
    """A submitted turn's events, read from the run channel (from the start, or after ``after``: the SSE
    ``Last-Event-ID``): iterated in a thread, or with ``async for`` on an ASGI door (no thread held while it waits).
    Each event carries its ``event_id``. Closing it stops reading only: the turn runs on, on its worker.

    A stream that falls quiet is checked against the database: a turn found finished some other way (the sweep
    after a crash, a later message) ends with its saved outcome."""

    def __init__(self, turn: Turn, *, after: str = "0") -> None:
        self.turn_id = turn.pk
        self.after = after or "0"
        self._sync: Iterator[TurnEvent] | None = None

    def _idle(self) -> TurnEvent | None:
        try:
            turn = Turn.objects.filter(pk=self.turn_id).first()
            if turn is None:
                return {"type": "error", "code": "not_found", "message": "This turn was deleted."}
            if turn.status in FINISHED:
                return turn_end_event(turn)
            return None
        finally:
            release_connection()  # a reader waits on the channel, not on the database

    def _events(self) -> Iterator[TurnEvent]:
        release_connection()
        for event_id, event in run_channel.follow(self.turn_id, after=self.after, idle=self._idle):
            yield _with_id(event, event_id)

    def __iter__(self) -> RunStream:
        return self

    def __next__(self) -> TurnEvent:
        if self._sync is None:
            self._sync = self._events()
        return next(self._sync)

    async def __aiter__(self) -> AsyncIterator[TurnEvent]:
        idle = sync_to_async(self._idle, thread_sensitive=False)
        async for event_id, event in run_channel.afollow(self.turn_id, after=self.after, idle=idle):
            yield _with_id(event, event_id)

    def close(self) -> None:
        if self._sync is not None:
            close = getattr(self._sync, "close", None)
            if close is not None:
                close()


def _with_id(event: dict[str, Any], event_id: str) -> TurnEvent:
    """A channel event as the doors send it: with its id (the SSE ``id:``), when it has one."""
    return cast(TurnEvent, {**event, "event_id": event_id} if event_id else event)


def turn_follow(turn: Turn, *, after: str = "") -> Iterator[TurnEvent] | RunStream:
    """A turn's events for a client that comes back (SSE ``Last-Event-ID``): the rest of its run from the channel
    while it is kept, else what is saved (a finished turn's end; a running one's run, as it comes)."""
    if run_channel.channel_url() is not None and (turn.status not in FINISHED or run_channel.exists(turn.pk)):
        return RunStream(turn, after=after)
    return iter([turn_end_event(turn)])


@contextlib.contextmanager
def connections_released_while_models_answer() -> Iterator[None]:
    """In a turn worker's thread: give the database connection back before each model call (to the pool, or
    closed), so hundreds of turns waiting on models hold no connections."""
    token = release_connection_before_model_calls.set(True)
    try:
        yield
    finally:
        release_connection_before_model_calls.reset(token)
        release_connection()


def turn_recover(*, turn_id: int) -> bool:
    """Finish a turn whose process died mid-call: hand it to a turn worker (``TURN_RUNNER=worker``), else run it
    here. Returns False when it is running elsewhere or already done."""
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
        if turn_runner() == "worker":
            # Resumed where turns run: handed to the turn workers (whose threads wait on models by the hundred),
            # not on this worker's few threads, where tens of turns left by a dead worker queued one behind another.
            handle = TurnHandle(session=turn.session, turn=turn, lock=lock, resumed=True)
            if turn_submit(handle) is not None:
                return True
            # The broker refused it: it runs here, the lease taken back by turn_submit.
        # A client may follow the turn on the run channel (its message's stream, left waiting by a dead worker).
        channel = run_channel.channel_url() is not None
        for event in _execute(turn.session, turn, resumed=True):
            if channel:
                _publish_quietly(turn.pk, event)
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


# A sweep does not send the same turn to recovery again within this window, while its recovery task may still be
# queued. Short: the sweep only sends turns that nobody runs (their lease free or run out), and a recovery task
# that finds the turn taken meanwhile does nothing, so a resend costs one statement, and a lost one a window.
RECOVERY_RESEND_AFTER = timedelta(seconds=30)


def stuck_turns_enqueue(*, older_than: timedelta | None = None, limit: int = 200) -> int:
    """The periodic sweep (every ``TURN_SWEEP_SECONDS``): let go of the leases of turns whose task was lost
    (``lost_turns_let_go``), then send each turn that nobody runs, older than ``older_than``, to a recovery task
    of its own (at most ``limit``, not one sent within ``RECOVERY_RESEND_AFTER``). Returns how many were sent.

    One task for all of them had one time limit for all: after a crash with many turns to finish, it cut
    the turn it was answering short, and that turn failed; the ones after it waited for the next sweep."""
    try:
        lost_turns_let_go()
    except Exception:  # the orphans below are still swept
        logger.exception("could not look for turns whose task was lost")
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


def lost_turns_let_go() -> int:
    """Turns handed to a turn worker whose task is gone: their lease was handed over more than
    ``TURN_CLAIM_SECONDS`` ago, no worker claimed it, and no task for it waits in the turns queue (the task was
    reserved by a worker that died or was stopped, or failed before it picked its turn up). Their leases are let
    go, so this sweep resumes them now rather than when the hand-over runs out (``TURN_QUEUE_SECONDS``). Returns
    how many. On a broker whose queue cannot be read nothing is known to be lost, and the hand-over runs out."""
    grace = float(getattr(settings, "TURN_CLAIM_SECONDS", 10))
    owners = unclaimed_lease_owners(older_than=timedelta(seconds=grace))
    if not owners:
        return 0
    queued = queued_args(RUN_TURN_TASK, queue=turns_queue_name())
    if queued is None:
        return 0
    waiting = {str(args[1]) for args in queued if len(args) > 1}
    lost = unclaimed_leases_let_go([owner for owner in owners if owner not in waiting], older_than=grace)
    if lost:
        logger.warning("%s turn(s) handed to a turn worker were never picked up; resuming them", len(lost))
    return len(lost)


def _stuck(older_than: timedelta | None) -> QuerySet[Turn]:
    age = older_than if older_than is not None else timedelta(seconds=int(getattr(settings, "STUCK_TURN_SECONDS", 10)))
    return orphaned_turns_find(older_than=age)


def staff_display_name(user: Any) -> str:
    """How a staff member signs a reply to a user: their full name, else ``STAFF_REPLY_NAME`` ("Support")."""
    full = getattr(user, "get_full_name", lambda: "")() or ""
    return " ".join(full.split())[:80] or str(getattr(settings, "STAFF_REPLY_NAME", "Support"))


def handoff_reply(*, session: ChatSession, text: str, author: Any) -> Turn:
    """A person answers a session that was handed to a human; the reply is added to the latest turn (its text,
    and its list of staff replies, which the chat shows apart and live)."""
    text = validate_message(text)
    turn = session.turns.order_by("-seq").first()
    if turn is None:
        raise MessageRejected("no_turn", "This session has no message to answer yet.")
    # The user sees a name to address, not a login: the staff member's full name, else STAFF_REPLY_NAME. The
    # username stays in the reply for staff pages (the live chat) and is never sent to the user.
    reply = {
        "author": staff_display_name(author),
        "staff": author.get_username(),
        "text": text,
        "at": timezone.now().isoformat(),
    }
    turn_staff_reply_append(session=session, turn=turn, reply=reply, signed=staff_signed(reply))
    run_channel.session_changed(session.pk)
    turn.refresh_from_db(fields=["assistant_message", "staff_replies"])
    return turn


def handoff_request(*, session: ChatSession, actor: Any = None, reason: str = "") -> bool:
    """Staff hand a session to a person: the agent stops answering it until it is handed back. False when it
    was with a person already."""
    detail = f"handed to a person by {actor or 'staff'}" + (f": {reason}" if reason else "")
    changed = session_hand_off(session=session, detail=detail)
    if changed:
        run_channel.session_changed(session.pk)
    return changed


def handoff_resume(*, session: ChatSession, actor: Any = None) -> ChatSession:
    """Give a handed-off session back to the agent."""
    session_hand_back(session=session, actor=actor)
    run_channel.session_changed(session.pk)
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
        # The session's other open pages (another tab, a turn sent through the API) show it without polling.
        run_channel.session_changed(session.pk)


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
