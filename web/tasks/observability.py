from __future__ import annotations

from observability.services import alerts_evaluate
from web.tasks.registry import background_task


@background_task(
    autoretry_for=(ConnectionError,),
    retry_backoff=True,
    retry_backoff_max=60,
    max_retries=3,
    soft_time_limit=45,
    time_limit=55,
    # A late run is superseded by the next minute's: do not pile up evaluations behind a slow worker.
    expires=55,
)
def evaluate_alerts() -> None:
    # Idempotent: open alerts are unique per rule and scope, so a duplicate run fires nothing new.
    alerts_evaluate()
