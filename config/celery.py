from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery import Celery, bootsteps
from celery.signals import beat_init, before_task_publish, celeryd_init, worker_process_init, worker_ready
from click import Option

from core.embedded_broker import ensure_configured

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

logger = logging.getLogger(__name__)

app = Celery("agents_runtime")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["web"])


class HeartbeatStep(bootsteps.StartStopStep):
    """Record a heartbeat from the worker's main process every WORKER_HEARTBEAT_SECONDS.

    The beat-scheduled heartbeat task proves tasks flow end to end, but it waits in the queue behind
    long tasks (a first memory write loads the embedding model). This one shows the worker itself is
    alive even then; /healthz accepts either.
    """

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        self.tref: Any = None

    def start(self, worker: Any) -> None:
        from django.conf import settings

        self.tref = worker.timer.call_repeatedly(
            float(settings.WORKER_HEARTBEAT_SECONDS), self._beat, (worker,), priority=10
        )
        self._beat(worker)

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def _beat(self, worker: Any) -> None:
        from django.db import close_old_connections

        from core.services import worker_heartbeat_record

        try:
            close_old_connections()
            worker_heartbeat_record(hostname=worker.hostname, queues=_consumed_queues(worker))
        except Exception:  # the database may be restarting; the next beat tries again
            logger.warning("could not record the worker heartbeat", exc_info=True)


def _consumed_queues(worker: Any) -> list[str]:
    """The queues this worker takes tasks from (``-Q``; every declared queue without it): /healthz tells the
    background worker from the turn worker by them."""
    try:
        queues = worker.app.amqp.queues
        return sorted(getattr(queues, "consume_from", None) or queues)
    except Exception:  # noqa: BLE001 - a heartbeat without its queues still says the worker is alive
        return []


app.steps["worker"].add(HeartbeatStep)

app.user_options["worker"].add(
    Option(
        ("--beat-thread",),
        is_flag=True,
        default=False,
        help="Run the beat scheduler on a thread of this worker (Celery's --beat forks a second process).",
    )
)


class ThreadedBeat(bootsteps.StartStopStep):
    """The beat scheduler on a thread of the worker (``--beat-thread``), where ``--beat`` forks a process of
    its own: under ``make run`` that child held ~77 MB of resident memory (bench/footprint.py) to wake once a
    few seconds and send a task. The schedule, its file and its tasks are the same; it stops with the worker.
    Run it in one worker only, as ``--beat``."""

    label = "Beat (thread)"
    conditional = True

    def __init__(self, worker: Any, beat_thread: bool = False, **kwargs: Any) -> None:
        self.enabled = bool(beat_thread)
        super().__init__(worker, **kwargs)

    def create(self, worker: Any) -> Any:
        from celery.beat import EmbeddedService

        return EmbeddedService(
            worker.app, thread=True, schedule_filename=worker.schedule_filename, scheduler_cls=worker.scheduler
        )


app.steps["worker"].add(ThreadedBeat)


@before_task_publish.connect
def _stamp_sent_at(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    # When the task was sent: the queue's oldest wait in /metrics (core.queue.queue_stats).
    if headers is not None:
        headers.setdefault("sent_at", time.time())


@celeryd_init.connect
@beat_init.connect
def _embedded_broker(**kwargs: Any) -> None:
    # A worker or beat started by hand on the embedded default: the broker it needs, started if not running.
    ensure_configured()


@worker_process_init.connect
def _warm_up_worker_process(**kwargs: Any) -> None:
    from web.warmup import process_prepare, warm_up_in_background

    process_prepare()
    warm_up_in_background()


@worker_ready.connect
def _warm_up_worker_without_children(sender: Any = None, **kwargs: Any) -> None:
    # A worker whose tasks run in its own process (the turn worker's threads; solo) has no pool process to warm:
    # it sets up and loads the models itself, before its first turn rather than during it.
    pool = getattr(sender, "pool", None)
    if pool is not None and "prefork" not in type(pool).__module__:
        from web.warmup import process_prepare, warm_up_in_background

        process_prepare()
        warm_up_in_background()
