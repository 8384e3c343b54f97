from __future__ import annotations

from typing import Any

from core.services import worker_heartbeat_record
from web.tasks.registry import background_task


@background_task(bind=True)
def record_worker_heartbeat(self: Any) -> None:
    # Note: the heartbeat travels through the broker, so a fresh row proves broker and worker both work.
    worker_heartbeat_record(hostname=self.request.hostname)
