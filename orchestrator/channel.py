"""A turn's events on the run channel (``core.events``): published by whoever runs the turn, read by the doors.

``RunStream`` follows a turn that runs elsewhere (on a turn worker, or resumed by the sweep), from the start or
after the last event a client saw; ``turn_follow`` is what a client that comes back reads; ``turn_end_event`` is
a finished turn's last event, from what is saved.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

from asgiref.sync import sync_to_async

from core import events as run_channel
from core.db import release_connection
from orchestrator.context import FINISHED, TurnEvent, done_event, error_event
from sessions.models import ChatSession, Turn

logger = logging.getLogger(__name__)


def turn_end_publish(turn: Turn) -> None:
    """Publish a finished turn's end for its followers, unless its run already ended on the channel (a second
    delivery of its task must not add a second end)."""
    if not run_channel.exists(turn.pk):
        run_channel.publish(turn.pk, turn_end_event(turn))


def publish_quietly(run: int, event: TurnEvent) -> None:
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
