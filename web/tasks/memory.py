"""Celery tasks of the memory app: thin, by id, idempotent (the service checks what is already written)."""

from __future__ import annotations

from typing import Any

from django.db import OperationalError

from memory.embedding import EmbeddingServiceUnavailable
from memory.services import memory_writes_requeue, turn_memories_write, user_indexes_sync
from web.tasks.registry import OUTBOX_SWEEP, TURN_AFTERMATH, background_task


# A stalled or restarting embedding service is waited out too (the write is idempotent).
@background_task(
    bind=True,
    autoretry_for=(OperationalError, ConnectionError, EmbeddingServiceUnavailable),
    retry_backoff_max=120,
    **TURN_AFTERMATH,
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


@background_task(**OUTBOX_SWEEP)
def requeue_lost_memory_writes() -> int:
    # Writes whose enqueue was lost while the broker was down.
    return memory_writes_requeue()


@background_task(
    autoretry_for=(OperationalError,),
    retry_backoff=60,
    max_retries=3,
    soft_time_limit=3 * 3600,
    time_limit=3 * 3600 + 300,
)
def sync_user_indexes() -> dict[str, list[int]]:
    # Daily (beat): an HNSW index of their own for users whose history outgrew the exact search.
    result = user_indexes_sync()
    return {"created": result.created, "dropped": result.dropped}
