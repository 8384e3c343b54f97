"""Turns run by a turn worker: accepted here, executed there, their events read from the run channel.

``turn_runner`` says where accepted turns run; ``turn_submit`` sends one to a turn worker with the session's
lease (``RUN_TURN_TASK``), after ``turns_queue_check`` (back-pressure); ``turn_execute`` is what the worker
runs, publishing each event on the run channel.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from django.conf import settings

from core import events as run_channel
from core import task_names
from core.db import release_connection
from core.errors import Refusal
from core.queue import enqueue
from orchestrator.begin import TurnHandle
from orchestrator.channel import RunStream, turn_end_publish
from orchestrator.context import FINISHED, UNFINISHED, release_connection_before_model_calls
from orchestrator.pipeline import turn_events
from sessions.locks import SessionTurnLock, lease_let_go
from sessions.models import Turn

logger = logging.getLogger(__name__)


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


RUN_TURN_TASK = task_names.RUN_TURN


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
            turn_end_publish(turn)
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
        turn_end_publish(turn)
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
