"""What staff do to memories already written (the admin's actions and the memory desk): re-embed, pin,
archive, merge duplicates, and accept or reject a contradicting fact queued for review."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from memory.embedding import get_embedder
from memory.models import Memory, MemoryReview
from memory.services.duplicates import lock_user_memories
from memory.services.embed import embed_text
from memory.services.turns import FACT_IMPORTANCE
from memory.services.writes import memory_create, memory_update


def memories_reembed(
    *,
    memories: Iterable[Memory],
    batch_size: int = 64,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Recompute embeddings with the current embedder (after a model change, or from the admin)."""
    embedder = get_embedder()
    done = 0
    batch: list[Memory] = []

    def flush() -> None:
        nonlocal done
        vectors = embedder.embed([m.text for m in batch])
        for memory, vector in zip(batch, vectors, strict=True):
            memory.embedding = vector
            memory.embedding_model = embedder.name
        Memory.objects.bulk_update(batch, ["embedding", "embedding_model"])
        done += len(batch)
        if on_progress is not None:
            on_progress(len(batch))
        batch.clear()

    for memory in memories:
        batch.append(memory)
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    return done


def memories_set_pinned(*, memories: QuerySet[Memory], pinned: bool) -> int:
    """Pin (always included for their user) or unpin memories."""
    return memories.update(pinned=pinned, updated_at=timezone.now())


def memories_set_archived(*, memories: QuerySet[Memory], archived: bool) -> int:
    """Archive (never retrieved again, kept for history) or restore memories."""
    return memories.update(archived=archived, updated_at=timezone.now())


def merge_plan(memories: Sequence[Memory]) -> tuple[Memory, list[Memory], str]:
    """What merging ``memories`` would do: the one kept, the ones archived, and the kept one's proposed text
    (each distinct text once, the kept one's first, one to a line: staff edit it into one statement before they
    confirm; run together, "User: I sail. User: my boat is Wren." read as one glued sentence). ``ValueError`` when they may not be merged: fewer than two,
    of different users, or of different kinds (an episode and a fact are not duplicates of each other)."""
    if len(memories) < 2:
        raise ValueError("select at least two memories to merge")
    if len({m.user_id for m in memories}) != 1:
        raise ValueError("memories of different users cannot be merged")
    kinds = sorted({m.kind for m in memories})
    if len(kinds) != 1:
        raise ValueError(f"memories of different kinds ({', '.join(kinds)}) cannot be merged: select one kind")
    if any(m.valid_to is not None for m in memories):
        raise ValueError("a fact that was replaced is history, not a duplicate: select memories in force")
    # The one kept is in force: an archived one is kept only when all are archived.
    ordered = sorted(memories, key=lambda m: (m.archived, not m.pinned, -m.importance, m.created_at, m.id))
    seen: set[str] = set()
    parts: list[str] = []
    for memory in ordered:
        text = " ".join(memory.text.split())
        key = text.lower().rstrip(_SENTENCE_ENDS + _CLOSERS + " ")
        if text and key not in seen:
            seen.add(key)
            parts.append(_as_sentence(text))
    return ordered[0], ordered[1:], "\n".join(parts)


_SENTENCE_ENDS = ".!?…"
_CLOSERS = "\"')]}»”’"


def _as_sentence(text: str) -> str:
    """``text`` ending as a sentence: a full stop added only where none ends it, closing brackets and quotes aside
    ("…or tell me what to change.)" stays as it is; it became "…what to change.).")."""
    return text if text.rstrip(_CLOSERS)[-1:] in tuple(_SENTENCE_ENDS) else text + "."


def memories_merge(*, memories: Sequence[Memory], text: str | None = None) -> Memory:
    """Merge duplicates of one user and one kind into one memory (``merge_plan``): the kept one takes ``text``
    (as staff edited it; else the plan's combined text), re-embedded, the highest importance, the pin and the
    access counts; the others are archived. All in one transaction. ``ValueError`` for an empty text."""
    keeper, others, planned = merge_plan(memories)
    text = planned if text is None else text.strip()
    if not text:
        raise ValueError("the merged memory needs text")
    with transaction.atomic():
        now = timezone.now()
        # Archived and closed: they are replaced by the kept one (closing also takes them out of the duplicate
        # check, so the kept one can take a text that one of them had).
        Memory.objects.filter(id__in=[m.id for m in others]).update(archived=True, valid_to=now, updated_at=now)
        keeper.importance = max(m.importance for m in memories)
        keeper.pinned = any(m.pinned for m in memories)
        keeper.access_count = sum(m.access_count for m in memories)
        keeper.save(update_fields=["importance", "pinned", "access_count", "updated_at"])
        if text != keeper.text:
            keeper = memory_update(memory=keeper, text=text)
    return keeper


def review_apply(*, review: MemoryReview, actor: Any = None) -> Memory:
    """Accept a queued contradicting fact: the old fact is closed, the proposed one becomes current."""
    now = timezone.now()
    # Embedded before the transaction: the review's and the user's locks are not held while a model runs.
    embedded = embed_text(review.proposed_text.strip())
    # One transaction: the old fact is never closed without the new one in force, nor the review left pending.
    with transaction.atomic():
        # The user's lock first, as every writer takes it (before any row lock): else a turn's memory write
        # holding it and waiting for the old fact's row deadlocks with this holding the row.
        lock_user_memories(review.user_id)
        review = MemoryReview.objects.select_for_update().get(pk=review.pk)
        if review.status != MemoryReview.Status.PENDING:
            raise ValueError(f"review {review.pk} is already {review.status}")
        Memory.objects.filter(pk=review.existing_id, valid_to__isnull=True).update(
            valid_to=now, needs_review=False, updated_at=now
        )
        new = memory_create(
            user=review.user,
            kind=Memory.Kind.SEMANTIC,
            text=review.proposed_text,
            fact_key=review.proposed_key,
            importance=FACT_IMPORTANCE,
            source_session=review.source_session,
            source_turn=review.source_turn,
            embedded=embedded,
        )
        MemoryReview.objects.filter(pk=review.pk).update(
            status=MemoryReview.Status.APPLIED, resolved_at=now, resolved_by=actor
        )
    return new


def review_reject(*, review: MemoryReview, actor: Any = None) -> MemoryReview:
    """Discard a queued contradicting fact; the existing fact stays current."""
    now = timezone.now()
    with transaction.atomic():
        lock_user_memories(review.user_id)  # first, as in review_apply; a write may be queueing a review now
        review = MemoryReview.objects.select_for_update().get(pk=review.pk)
        if review.status != MemoryReview.Status.PENDING:
            raise ValueError(f"review {review.pk} is already {review.status}")
        review.status = MemoryReview.Status.REJECTED
        review.resolved_at = now
        review.resolved_by = actor
        review.save(update_fields=["status", "resolved_at", "resolved_by"])
        still_pending = MemoryReview.objects.filter(
            existing_id=review.existing_id, status=MemoryReview.Status.PENDING
        ).exists()
        if not still_pending:
            Memory.objects.filter(pk=review.existing_id).update(needs_review=False, updated_at=now)
    return review
