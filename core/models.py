from __future__ import annotations

from django.db import models


class Dated(models.Model):
    """When a row people edit (an agent, an alert rule, a workflow, an endpoint) was made and last changed."""

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class WorkerHeartbeat(models.Model):
    """Last time a Celery worker ran the heartbeat task; /healthz reads it.

    One row per worker hostname, updated in place by ``web.tasks.core.record_worker_heartbeat``.
    """

    hostname = models.CharField(max_length=255, unique=True)
    seen_at = models.DateTimeField()
    # The queues the worker takes tasks from, comma-separated: /healthz tells the background worker (the default
    # queue) from the turn worker (``<queue>-turns``) by them. Empty: not recorded (counted as a background worker).
    queues = models.CharField(max_length=1000, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.hostname} @ {self.seen_at:%Y-%m-%d %H:%M:%S}"


class TaskSendFailure(models.Model):
    """How often a background task could not be sent to the broker, per task name (``/metrics``).

    A failed send is logged where it happens and the work waits for an outbox sweep; this count lets an
    operator alert on it. One row per task name, incremented in place (``core.services``).
    """

    task = models.CharField(max_length=255, unique=True)
    count = models.BigIntegerField(default=0)
    last_at = models.DateTimeField()
    last_error = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.task}: {self.count}"
