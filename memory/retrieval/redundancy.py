"""How much a user's memories look alike, and so how far fusion corrects plain meaning for them.

A store of conversation turns is redundant: two people talk about the same things for weeks, and each turn has
close lookalikes by meaning (the newest 256 turns of a LoCoMo conversation: a turn's 10 nearest fellows at a
mean cosine of 0.57 to 0.68). There the cosine cannot tell the turn a question is about from its lookalikes,
and the word arm and the hubness correction are what find it (LoCoMo turns: recall@10 from dense's 0.425 to
0.754, tuning split). A store of independent facts about a life is not (0.37 to 0.50: a fact's nearest
fellow is about something else); there the cosine already points at the memory, and a word the query shares
with an unrelated memory, or a discount on the most central memory of a topic, only moves it away (the
`people` corpus, tuning split: 0.094 below dense at recall@5 with both corrections, level with them off).

``store_redundancy`` measures it on the user's newest REDUNDANCY_SAMPLE memories (each one's mean cosine to
its REDUNDANCY_K nearest others, averaged), kept per user and process for REDUNDANCY_TTL_SECONDS: it moves
slowly, and one read of a few hundred vectors a user every few minutes is nothing next to a turn.
``correction_scale`` turns it into the corrections' share, 0 at or under REDUNDANCY_FLOOR to 1 from
REDUNDANCY_FULL. bench/README.md has the measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.utils import timezone

from memory.retrieval import tuning
from memory.retrieval.cache import UserCache
from memory.retrieval.sql import CURRENT_SQL
from memory.retrieval.vector import nearest_mean_cosines

# The newest memories with a vector that fusion can rank (in force now, not procedures), as pgvector's binary
# form: index memory_user_recent gives them in order (no tie-break on id: that would sort every row of a
# user whose memories share one created_at, as an import writes them).
_SAMPLE_SQL = f"""
SELECT vector_send(embedding) FROM memory_memory
WHERE user_id = %(user)s AND kind <> 'procedural' AND embedding IS NOT NULL AND {CURRENT_SQL}
ORDER BY created_at DESC LIMIT %(sample)s
"""

_redundancies: UserCache[float] = UserCache(ttl_seconds=tuning.REDUNDANCY_TTL_SECONDS)
_UNMEASURED = -1.0  # kept for a store too small to measure (the cache keeps no None)


@dataclass(frozen=True)
class StoreShape:
    """What fusion needs to know of a user's store: its redundancy (None: too few memories to measure) and
    the share of the corrections that earns (``correction_scale``)."""

    redundancy: float | None
    corrections: float


def store_shape(user_id: int) -> StoreShape:
    value = store_redundancy(user_id)
    return StoreShape(redundancy=value, corrections=correction_scale(value))


def redundancies_forget() -> None:
    """Forget the redundancy of every user this process measured (tests; a bulk import)."""
    _redundancies.clear()


def store_redundancy(user_id: int) -> float | None:
    """The mean cosine of the user's newest REDUNDANCY_SAMPLE memories to their REDUNDANCY_K nearest fellows
    among them; None for a store of fewer than REDUNDANCY_MIN_MEMORIES (too few to tell: fusion applies its
    corrections whole, as it always did). Measured again at most every REDUNDANCY_TTL_SECONDS per process."""
    key = (user_id, tuning.REDUNDANCY_SAMPLE, tuning.REDUNDANCY_K, tuning.REDUNDANCY_MIN_MEMORIES)
    _redundancies.ttl_seconds = tuning.REDUNDANCY_TTL_SECONDS  # read each time: a test or a sweep may set it
    cached = _redundancies.get(key)
    if cached is None:
        with connection.cursor() as cursor:
            cursor.execute(_SAMPLE_SQL, {"user": user_id, "sample": tuning.REDUNDANCY_SAMPLE, "now": timezone.now()})
            raw = [bytes(row[0]) for row in cursor.fetchall()]
        cached = redundancy(raw, tuning.REDUNDANCY_K) if is_measurable(len(raw)) else _UNMEASURED
        _redundancies.put(key, cached)
    return None if cached == _UNMEASURED else cached


def is_measurable(count: int) -> bool:
    """Whether a sample of ``count`` memories tells a store's shape (REDUNDANCY_MIN_MEMORIES, at least two)."""
    return count >= max(2, tuning.REDUNDANCY_MIN_MEMORIES)


def redundancy(raw_vectors: list[bytes], k: int) -> float:
    """The mean, over the vectors (``vector_send`` form), of each one's mean cosine to its ``k`` nearest
    others; 0 for fewer than two."""
    if len(raw_vectors) < 2 or k < 1:
        return 0.0
    return float(nearest_mean_cosines(raw_vectors, k).mean())


def correction_scale(value: float | None) -> float:
    """The share (0 to 1) of the corrections that fusion applies in a store of this redundancy: none at or
    under REDUNDANCY_FLOOR, all from REDUNDANCY_FULL, linear in between; all of them where it was not measured."""
    if value is None:
        return 1.0
    floor, full = tuning.REDUNDANCY_FLOOR, tuning.REDUNDANCY_FULL
    if full <= floor:
        return 1.0 if value > floor else 0.0
    return min(1.0, max(0.0, (value - floor) / (full - floor)))
