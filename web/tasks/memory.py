"""Celery tasks of the memory app: thin, by id, idempotent (the service checks what is already written)."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import OperationalError

from memory.embedding import EmbeddingServiceUnavailable
from memory.services import memory_writes_requeue, turn_memories_write, user_indexes_sync


@shared_task(
    name="memory.tasks.write_turn_memories",
    bind=True,
    # A stalled or restarting embedding service is waited out too (the write is idempotent).
    autoretry_for=(OperationalError, ConnectionError, EmbeddingServiceUnavailable),
    retry_backoff=2,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=5,
    soft_time_limit=90,
    time_limit=120,
    acks_late=True,
)
def write_turn_memories(self: Any, turn_id: int) -> dict[str, Any]:
    """Write a finished turn's episodic memory and extracted facts (once, however often it runs)."""
    result = turn_memories_write(turn_id=turn_id)
    return {
        "turn_id": result.turn_id,
        "written": result.written,
        "episodic_id": result.episodic_id,
        "facts_added": result.facts_added,
        "facts_superseded": result.facts_superseded,
        "reviews": result.reviews,
        "extraction_error": result.extraction_error,
    }


@shared_task(
    name="memory.tasks.requeue_lost_memory_writes",
    autoretry_for=(OperationalError,),
    retry_backoff=5,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=3,
    soft_time_limit=60,
    time_limit=90,
    ignore_result=True,
)
def requeue_lost_memory_writes() -> int:
    # The outbox sweep (beat, every few minutes): writes whose enqueue was lost while the broker was down.
    return memory_writes_requeue()


@shared_task(
    name="memory.tasks.sync_user_indexes",
    autoretry_for=(OperationalError,),
    retry_backoff=60,
    max_retries=3,
    soft_time_limit=3 * 3600,
    time_limit=3 * 3600 + 300,
    ignore_result=True,
)
def sync_user_indexes() -> dict[str, list[int]]:
    # Daily (beat): an HNSW index of their own for users whose history outgrew the exact search.
    result = user_indexes_sync()
    return {"created": result.created, "dropped": result.dropped}
