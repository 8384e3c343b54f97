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

Here: the entry points (``turn_run``, ``turn_stream``), which run a turn in the request or on a turn worker.
The rest, under the names the doors import from here: ``orchestrator.pipeline`` (running an accepted turn),
``orchestrator.worker`` (submitting it to a turn worker, and what the worker runs), ``orchestrator.channel``
(its events on the run channel), ``orchestrator.recovery`` (lost turns and the sweep), ``orchestrator.staff``
(handing a session to a person and back, staff replies).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from orchestrator.begin import (
    MessageRejected,
    SessionClosedError,
    TurnHandle,
    turn_begin,
    turn_in_flight,
    validate_message,
)
from orchestrator.channel import RunStream, turn_follow
from orchestrator.context import AGENT_SWITCHED_OFF, FINISHED, HANDOFF_NOTICE, TurnEvent
from orchestrator.pipeline import PIPELINE, TurnStream, turn_events
from orchestrator.recovery import stuck_turns_enqueue, stuck_turns_recover, turn_recover
from orchestrator.staff import handoff_reply, handoff_request, handoff_resume
from orchestrator.worker import turn_execute, turn_runner, turn_submit, turns_queue_check
from sessions.models import ChatSession, Turn

__all__ = [
    "AGENT_SWITCHED_OFF",
    "HANDOFF_NOTICE",
    "PIPELINE",
    "MessageRejected",
    "RunStream",
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
    "turn_execute",
    "turn_follow",
    "turn_recover",
    "turn_run",
    "turn_stream",
    "validate_message",
]


@dataclass
class TurnResult:
    turn: Turn
    reply: str
    replayed: bool = False
    is_demo: bool = False
    recovered: list[Turn] = field(default_factory=list)


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
