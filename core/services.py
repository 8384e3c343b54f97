from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable
from datetime import timedelta

from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from core.models import TaskSendFailure, WorkerHeartbeat

logger = logging.getLogger(__name__)


def worker_heartbeat_record(*, hostname: str | None = None, queues: list[str] | None = None) -> WorkerHeartbeat:
    """Record that a worker on ``hostname`` is alive and consuming tasks now (from ``queues``, when given; a
    heartbeat that names none keeps what was recorded)."""
    name = hostname or socket.gethostname()
    defaults: dict[str, object] = {"seen_at": timezone.now()}
    if queues is not None:
        defaults["queues"] = ",".join(sorted(queues))[:1000]
    beat, _ = WorkerHeartbeat.objects.update_or_create(hostname=name, defaults=defaults)
    return beat


def task_send_failure_record(*, task: str, error: str) -> None:
    """Count one failed send of ``task`` (the broker refused or was unreachable, or the name is unknown)."""
    now, error = timezone.now(), error[:2000]
    changes = {"count": F("count") + 1, "last_at": now, "last_error": error}
    if TaskSendFailure.objects.filter(task=task).update(**changes):
        return
    try:
        with transaction.atomic():
            TaskSendFailure.objects.create(task=task, count=1, last_at=now, last_error=error)
    except IntegrityError:  # another process created the row meanwhile
        TaskSendFailure.objects.filter(task=task).update(**changes)


# --- the outbox sweeps' claims ------------------------------------------------------------------------
def _requeue_key(kind: str, ident: object) -> str:
    return f"requeued:{kind}:{ident}"


def requeue_claim(kind: str, ident: object, *, within: timedelta) -> bool:
    """May a sweep enqueue ``kind`` ``ident`` again? True, and claimed, unless a sweep sent it within ``within``.

    The outbox sweeps (lost memory writes, lost summaries) call work lost by its age. With the workers
    behind by more than that age the work is still queued, and every sweep would add another copy: a
    backlog that feeds itself, each copy a model call when two run at once. The claim, in the shared
    cache (Redis, or the database table), lets one copy through per window. A cache that fails lets the
    sweep send, as it would without claims: a duplicate costs less than a write lost for good.
    """
    try:
        return bool(cache.add(_requeue_key(kind, ident), 1, timeout=max(1, int(within.total_seconds()))))
    except Exception:  # the claim only saves duplicates; the sweep must go on without it
        logger.warning("requeue claim for %s %s unavailable; sending anyway", kind, ident, exc_info=True)
        return True


def requeue_release(kind: str, ident: object) -> None:
    """Give a claim back (its enqueue failed): the next sweep sends it again."""
    try:
        cache.delete(_requeue_key(kind, ident))
    except Exception:  # an unreleased claim only delays the next try by its window
        logger.warning("could not release the requeue claim for %s %s", kind, ident, exc_info=True)


def requeue_each(
    kind: str, items: Iterable[tuple[object, Callable[[], object]]], *, within: timedelta, limit: int
) -> int:
    """The outbox sweeps' loop: call each item's enqueue unless a sweep sent it within ``within``
    (``requeue_claim``), at most ``limit`` of them; stop at the first enqueue that fails (the broker is
    still down: the next run retries). A claim whose enqueue did not happen, whatever stopped it, is given
    back. Returns how many were sent."""
    sent = 0
    for ident, enqueue in items:
        if sent >= limit:
            break
        if not requeue_claim(kind, ident, within=within):
            continue
        enqueued = False
        try:
            enqueue()
            enqueued = True
        except Exception:  # the broker is still unreachable; everything stays found for the next run
            logger.warning("could not re-enqueue %s %s; will retry", kind, ident, exc_info=True)
            break
        finally:
            if not enqueued:  # whatever stopped it (a time limit too): the next run may send it
                requeue_release(kind, ident)
        sent += 1
    return sent
