from __future__ import annotations

from celery import shared_task

from core.services import worker_heartbeat_record


@shared_task(name="config.tasks.record_worker_heartbeat", ignore_result=True)
def record_worker_heartbeat() -> None:
    # Note: the heartbeat travels through the broker, so a fresh row proves broker and worker both work.
    worker_heartbeat_record(hostname=record_worker_heartbeat.request.hostname)
