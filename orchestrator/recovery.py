"""Recovery of lost turns: a turn whose process died mid-call (``turn_recover``), and the periodic sweep that
finds them (``stuck_turns_enqueue``: one recovery task a turn) or finishes them here (``stuck_turns_recover``),
after letting go of the leases of turns whose task was lost (``lost_turns_let_go``).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db.models import QuerySet

from core import events as run_channel
from core import task_names
from core.queue import enqueue, queued_args
from core.services import requeue_each
from orchestrator.begin import TurnHandle
from orchestrator.channel import publish_quietly
from orchestrator.context import UNFINISHED
from orchestrator.pipeline import saved_turn_events
from orchestrator.worker import RUN_TURN_TASK, turn_runner, turn_submit, turns_queue_name
from sessions.locks import SessionTurnLock, unclaimed_leases_let_go
from sessions.models import Turn
from sessions.selectors import orphaned_turns_find, unclaimed_lease_owners

logger = logging.getLogger(__name__)


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
        for event in saved_turn_events(turn.session, turn, resumed=True):
            if channel:
                publish_quietly(turn.pk, event)
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
        ((turn_id, partial(enqueue, task_names.RECOVER_TURN, turn_id)) for turn_id in turn_ids),
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
