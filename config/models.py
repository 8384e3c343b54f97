from __future__ import annotations

from django.db import models


class WorkerHeartbeat(models.Model):
    """Last time a Celery worker ran the heartbeat task; /healthz reads it.

    One row per worker hostname, updated in place by ``config.tasks.record_worker_heartbeat``.
    """

    hostname = models.CharField(max_length=255, unique=True)
    seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.hostname} @ {self.seen_at:%Y-%m-%d %H:%M:%S}"
