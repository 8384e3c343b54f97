from __future__ import annotations

import socket

from django.utils import timezone

from config.models import WorkerHeartbeat


def worker_heartbeat_record(*, hostname: str | None = None) -> WorkerHeartbeat:
    """Record that a worker on ``hostname`` is alive and consuming tasks now."""
    name = hostname or socket.gethostname()
    beat, _ = WorkerHeartbeat.objects.update_or_create(hostname=name, defaults={"seen_at": timezone.now()})
    return beat
