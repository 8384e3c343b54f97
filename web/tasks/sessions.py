"""Celery tasks of the sessions app. Thin: take ids, call a service, retry with backoff, time-limited."""

from __future__ import annotations

from django.db import DatabaseError

from sessions.services import checkpoints_prune
from sessions.summaries import summaries_requeue, summarize_session_through
from web.tasks.registry import OUTBOX_SWEEP, TURN_AFTERMATH, background_task


@background_task(autoretry_for=(DatabaseError,), retry_backoff_max=60, **TURN_AFTERMATH)
def summarize_session(session_id: str, through_seq: int) -> bool:
    # Note: model failures do not retry here; the service falls back to an extractive summary.
    # Idempotent: a second run finds summary_through_seq already at through_seq and does nothing.
    return summarize_session_through(session_id=session_id, through_seq=through_seq)


@background_task(
    autoretry_for=(DatabaseError,),
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=3,
    soft_time_limit=600,
    time_limit=660,
)
def prune_checkpoints(keep_last: int | None = None) -> int:
    # Idempotent: a second run finds nothing left over the limit. The policy lives in the service.
    return checkpoints_prune(keep_last=keep_last)


@background_task(**OUTBOX_SWEEP)
def requeue_lost_summaries() -> int:
    # Summary requests whose task was lost while the broker was down.
    return summaries_requeue()
