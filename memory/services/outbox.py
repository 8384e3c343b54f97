"""Sending a turn's memory write to the task queue after its transaction commits, and the outbox sweep that
sends again the writes that were lost on the way (the broker down when the turn finished)."""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from core import task_names
from core.queue import enqueue, queued_args
from core.services import requeue_each
from memory.models import Memory
from sessions.models import Checkpoint, Turn

logger = logging.getLogger(__name__)

# The memory-write task (``web.tasks.memory.write_turn_memories``), sent by name: tasks are doors, above this.
WRITE_TASK = task_names.WRITE_TURN_MEMORIES


def memory_writes_enqueue(*, turn: Turn) -> None:
    """Schedule the turn's memory writes for after the current transaction commits."""
    turn_id = turn.id
    transaction.on_commit(lambda: enqueue(WRITE_TASK, turn_id))


# The outbox sweep: a turn's write is enqueued after commit, straight to the broker. If the broker was
# down at that moment the enqueue failed (logged, the turn is saved) and nothing would ever retry it.
# The completed turn itself is the durable record of the pending write: the sweep finds turns whose
# write never ran and enqueues them again. Give the normal path this long before calling a write lost.
MEMORY_WRITES_LOST_AFTER = timedelta(minutes=5)
# How far back the sweep looks (bounds its query; older losses are left alone).
MEMORY_WRITES_LOOKBACK = timedelta(days=1)
# A write the sweep sent is not sent again before this long (core.services.requeue_claim): with the
# workers behind, it is still in the queue.
MEMORY_WRITES_REQUEUE_AGAIN_AFTER = timedelta(minutes=30)


def turns_with_lost_memory_writes(
    *, older_than: timedelta = MEMORY_WRITES_LOST_AFTER, lookback: timedelta = MEMORY_WRITES_LOOKBACK
) -> QuerySet[Turn]:
    """Completed turns whose memory write never committed: no ``memories_written_at``, and no episode.

    ``Turn.memories_written_at`` is set in the write's own transaction, so it is there exactly when the
    write committed: an episode a user deleted later is never written again, and a write that died after
    its model call (a soft time limit, retries run out) is found and sent again. Handoff turns and turns
    answered by a person (no agent reply) never get a write, so they are not lost ones.
    """
    now = timezone.now()
    return (
        Turn.objects.filter(
            status=Turn.Status.COMPLETED,
            completed_at__lte=now - older_than,
            completed_at__gte=now - lookback,
        )
        .exclude(assistant_message="")
        .filter(memories_written_at__isnull=True)
        .exclude(Exists(Memory.objects.filter(source_turn=OuterRef("pk"), kind=Memory.Kind.EPISODIC)))
        .exclude(Exists(Checkpoint.objects.filter(turn=OuterRef("pk"), reason=Checkpoint.Reason.HANDOFF)))
        .order_by("completed_at")
    )


def memory_writes_requeue(
    *,
    older_than: timedelta = MEMORY_WRITES_LOST_AFTER,
    lookback: timedelta = MEMORY_WRITES_LOOKBACK,
    limit: int = 500,
    again_after: timedelta = MEMORY_WRITES_REQUEUE_AGAIN_AFTER,
) -> int:
    """Enqueue again the memory writes that were lost (see ``turns_with_lost_memory_writes``).

    Safe to run any number of times: the write is idempotent (one episode per turn), and a write sent
    within ``again_after`` is not sent again (``requeue_claim``), so a backlog does not grow by a copy of
    every pending write per run. Returns how many were enqueued (at most ``limit``); stops at the first
    enqueue that fails (the broker is still down: the next run retries).
    """
    # Past the ones sent recently (still queued), up to ``limit`` more.
    turn_ids = list(
        turns_with_lost_memory_writes(older_than=older_than, lookback=lookback).values_list("pk", flat=True)[
            : limit * 4
        ]
    )
    # Writes still waiting in the queue (workers behind) are not lost: they are not sent again.
    queued = queued_args(WRITE_TASK) if turn_ids else None
    if queued:
        turn_ids = [turn_id for turn_id in turn_ids if (turn_id,) not in queued]
    sent = requeue_each(
        "memory-write",
        ((turn_id, partial(enqueue, WRITE_TASK, turn_id)) for turn_id in turn_ids),
        within=again_after,
        limit=limit,
    )
    if sent:
        logger.info("re-enqueued %s lost memory writes", sent)
    return sent
