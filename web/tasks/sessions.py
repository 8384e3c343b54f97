"""Celery tasks of the sessions app. Thin: take ids, call a service, retry with backoff, time-limited."""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError

from sessions.services import checkpoints_prune
from sessions.summaries import summaries_requeue, summarize_session_through


@shared_task(
    name="sessions.tasks.summarize_session",
    autoretry_for=(DatabaseError,),
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=5,
    soft_time_limit=90,
    time_limit=120,
    acks_late=True,
    ignore_result=True,
)
def summarize_session(session_id: str, through_seq: int) -> bool:
    # Note: model failures do not retry here; the service falls back to an extractive summary.
    # Idempotent: a second run finds summary_through_seq already at through_seq and does nothing.
    return summarize_session_through(session_id=session_id, through_seq=through_seq)


@shared_task(
    name="sessions.tasks.prune_checkpoints",
    autoretry_for=(DatabaseError,),
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=3,
    soft_time_limit=600,
    time_limit=660,
    acks_late=True,
    ignore_result=True,
)
def prune_checkpoints(keep_last: int | None = None) -> int:
    # Idempotent: a second run finds nothing left over the limit. The policy lives in the service.

    return checkpoints_prune(keep_last=keep_last)


@shared_task(
    name="sessions.tasks.requeue_lost_summaries",
    autoretry_for=(DatabaseError,),
    retry_backoff=5,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=3,
    soft_time_limit=60,
    time_limit=90,
    ignore_result=True,
)
def requeue_lost_summaries() -> int:
    # The outbox sweep for summaries (beat): requests whose task was lost while the broker was down.
    return summaries_requeue()
