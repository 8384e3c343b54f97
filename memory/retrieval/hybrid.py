"""Tier 2: the vector and word arms of one user, fused on the query's own scale, with the episodes next to
the best candidates in their chat session pulled in (``neighbours``).

Fusion (FUSION): "cc", the default, is ``convex_fusion`` (each arm's score on this query's own scale);
"rrf" is reciprocal rank fusion (``VECTOR_WEIGHT / (RRF_K + vector rank) + TEXT_WEIGHT / (RRF_K + text
rank)``), kept for comparison in bench/memory_eval.py.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings

from memory.models import Memory
from memory.retrieval import tuning
from memory.retrieval.neighbours import neighbours_and_rows
from memory.retrieval.redundancy import StoreShape, store_shape
from memory.retrieval.result import HybridCandidate
from memory.retrieval.sql import RecentWindow
from memory.retrieval.vector import VectorArm, is_small_history, vector_arm
from memory.retrieval.words import word_candidates


@dataclass
class HybridSearch:
    """Tier 2's answer: the fused candidates, best first, and their rows (without the vectors)."""

    candidates: list[HybridCandidate]
    rows: dict[int, Memory]
    timings: dict[str, float]
    word_weight: float | None = None  # the word arm's share of the fused score for this query ("cc"; else None)
    redundancy: float | None = None  # how much the user's memories look alike (redundancy.py; "cc" only)
    corrections: float | None = None  # the share of the word arm and the hubness correction fusion applied
    hub_weight: float | None = None  # what each candidate's crowding took off its cosine ("cc" only)
    workflows: dict[int, str] = field(default_factory=dict)  # each episode's chat session's workflow (scope)


def hybrid_candidates(
    *,
    user: Any,
    query: str,
    vector: list[float] | None,
    now: datetime,
    limit: int | None = None,
    small: bool | None = None,
    words: list[tuple[int, float]] | None = None,
    window: RecentWindow | None = None,
    store: StoreShape | None = None,
) -> HybridSearch:
    """Vector and full-text candidates of one user, fused, best first, with their rows. ``small``
    (``is_small_history``), ``store`` (``store_shape``) and ``words`` (``word_candidates``, read with
    ``store.corrections``) are what the caller has read already, while the query was being embedded."""
    limit = limit or settings.MEMORY_CANDIDATES
    timings: dict[str, float] = {}
    started = time.perf_counter()
    corrections = None
    if tuning.FUSION == "cc":
        if store is None:
            store = store_shape(user.pk)
            timings["redundancy"] = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
        corrections = store.corrections
    timing = "text_search"
    if vector is None and corrections is not None and corrections < 1.0:
        # No meaning to fall back to: every word counts, whatever the store (the words the caller read were
        # weighed for fusion with meaning).
        words, corrections, timing = None, 1.0, "text_search_every_word"
    if words is None:
        words = word_candidates(
            user_id=user.pk,
            query=query,
            now=now,
            limit=limit,
            window=window,
            corrections=1.0 if corrections is None else corrections,
        )
        timings[timing] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
    if small is None:
        small = is_small_history(user.pk)
    arm = _vector_arm_of(
        user_id=user.pk,
        vector=vector,
        now=now,
        limit=limit,
        small=small,
        words=words,
        window=window,
        crowding=bool(tuning.HUB_WEIGHT and tuning.FUSION == "cc" and hub_share(corrections or 0.0)),
    )
    if vector is not None:
        timings["exact_search" if small else "vector_search"] = (time.perf_counter() - started) * 1000
    by_id = _join_arms(arm, words, limit)
    word_weight = fuse(list(by_id.values()), corrections=1.0 if corrections is None else corrections)
    started = time.perf_counter()
    workflows: dict[int, str] = {}
    rows = neighbours_and_rows(user_id=user.pk, by_id=by_id, window=window, workflows=workflows)
    timings["neighbours_and_rows"] = (time.perf_counter() - started) * 1000
    # Only rows of this user that still exist (a candidate deleted meanwhile simply drops out).
    fused = sorted((c for c in by_id.values() if c.memory_id in rows), key=lambda c: (-c.fused, -c.similarity))
    return HybridSearch(
        candidates=fused,
        rows=rows,
        timings=timings,
        word_weight=word_weight,
        redundancy=None if store is None else store.redundancy,
        corrections=corrections,
        hub_weight=None if corrections is None else tuning.HUB_WEIGHT * hub_share(corrections),
        workflows=workflows,
    )


def _vector_arm_of(
    *,
    user_id: int,
    vector: list[float] | None,
    now: datetime,
    limit: int,
    small: bool,
    words: list[tuple[int, float]],
    window: RecentWindow | None,
    crowding: bool,
) -> VectorArm:
    """The vector arm, with the word candidates' distances (and, with ``crowding``, each candidate's)."""
    # The vector arm asks for fewer rows from an HNSW index: with a filtered HNSW scan every extra row of a
    # big user's history costs graph steps, while full-text candidates are cheap (bench/memory_scale.py). An
    # exact search costs the same for any LIMIT.
    vector_limit = min(limit, settings.MEMORY_VECTOR_CANDIDATES)
    if not small:
        vector_limit = min(vector_limit, settings.MEMORY_HNSW_CANDIDATES)
    if vector is None:  # the query could not be embedded: the word arm alone, no meaning to compare
        return VectorArm(nearest=[], word_distance={}, with_vector=set(), crowding={})
    return vector_arm(
        user_id=user_id,
        vector=vector,
        now=now,
        limit=vector_limit,
        exact=small,
        also=words,
        also_limit=limit,
        window=window,
        crowding_k=tuning.HUB_K if crowding else 0,
    )


def _join_arms(arm: VectorArm, words: list[tuple[int, float]], limit: int) -> dict[int, HybridCandidate]:
    """Both arms' candidates by id, with their ranks, cosine, word share and crowding."""
    # The word arm's ties at its cut go to the memories nearer the query.
    words = sorted(words, key=lambda w: (-w[1], arm.word_distance.get(w[0], 1.0), w[0]))[:limit]
    by_id: dict[int, HybridCandidate] = {}
    for rank, (memory_id, distance) in enumerate(arm.nearest, start=1):
        cand = by_id.setdefault(memory_id, HybridCandidate(memory_id))
        cand.vector_rank = rank
        cand.similarity = 1.0 - distance
    for rank, (memory_id, share) in enumerate(words, start=1):
        cand = by_id.setdefault(
            memory_id, HybridCandidate(memory_id, similarity=1.0 - arm.word_distance.get(memory_id, 1.0))
        )
        cand.text_rank = rank
        cand.text_share = share
    # A candidate with a vector that was no fellow (past HUB_FELLOWS) is neither discounted nor spared: it
    # gets the fellows' mean crowding.
    typical = statistics.fmean(arm.crowding.values()) if arm.crowding else 0.0
    for memory_id, cand in by_id.items():
        cand.has_vector = memory_id in arm.with_vector
        measured = arm.crowding.get(memory_id)
        cand.crowding = measured if measured is not None else typical
        cand.scored = (
            cand.similarity if cand.has_vector else None,
            measured if cand.has_vector else None,
            cand.text_share,
        )
    return by_id


def fuse(candidates: list[HybridCandidate], *, corrections: float = 1.0) -> float | None:
    """Each candidate's fused score, by FUSION; the word arm's weight for this query ("cc"; else None).
    ``corrections``: the share of the word arm and the hubness correction to apply ("cc"; ``correction_scale``)."""
    if tuning.FUSION == "cc":
        return convex_fusion(candidates, corrections=corrections)
    rank_fusion(candidates)
    return None


def rank_fusion(candidates: list[HybridCandidate]) -> None:
    """Reciprocal rank fusion: each arm adds its weight over RRF_K plus the candidate's rank in it."""
    for c in candidates:
        c.fused = (tuning.VECTOR_WEIGHT / (tuning.RRF_K + c.vector_rank) if c.vector_rank else 0.0) + (
            tuning.TEXT_WEIGHT / (tuning.RRF_K + c.text_rank) if c.text_rank else 0.0
        )


def word_trust(best_share: float) -> float:
    """How far the word arm is trusted on a query (0 to 1), from the idf-weighted share of the query's words
    that its best match has (see WORD_TRUST_FLOOR)."""
    floor, full = tuning.WORD_TRUST_FLOOR, tuning.WORD_TRUST_FULL
    if full <= floor:
        return 1.0 if best_share > floor else 0.0
    return min(1.0, max(0.0, (best_share - floor) / (full - floor)))


def hub_share(corrections: float) -> float:
    """The share of HUB_WEIGHT applied in a store with this ``correction_scale``: HUB_DIVERSE_SHARE in a
    store of independent facts (0), all of it in a redundant one (1), linear in between."""
    return tuning.HUB_DIVERSE_SHARE + (1.0 - tuning.HUB_DIVERSE_SHARE) * corrections


def convex_fusion(candidates: list[HybridCandidate], *, corrections: float = 1.0) -> float:
    """Fused score as a convex combination of the two arms' scores, each on this query's own scale: the
    cosine, less HUB_WEIGHT times the candidate's crowding, between the worst and the best candidate's (every
    candidate with a vector has one: the word arm's are measured too; one without a vector scores 0 there),
    the word share as a part of the best. A memory passes the vector arm's best only where its words make
    up for more than the meaning it lacks.

    The word arm's weight is earned per query (``word_trust`` of the best word share, times 1 - VECTOR_SHARE):
    words that no memory has more than a sliver of leave the order to meaning. A query with no vector (the
    embedding failed) has only its words.

    ``corrections`` (0 to 1, ``correction_scale`` of the store's redundancy) scales the hubness correction
    (``hub_share``); the word shares come scaled already (``word_candidates``: in a store of independent facts
    only the words with a digit count). Returns the word arm's weight."""
    hub_weight = tuning.HUB_WEIGHT * hub_share(corrections)
    sims = {c.memory_id: c.similarity - hub_weight * c.crowding for c in candidates if c.has_vector}
    low, high = min(sims.values(), default=0.0), max(sims.values(), default=0.0)
    share_high = max((c.text_share for c in candidates), default=0.0)
    word_weight = (1.0 - tuning.VECTOR_SHARE) * (word_trust(share_high) if sims else 1.0)
    for c in candidates:
        sim = sims.get(c.memory_id)
        if sim is None:
            meaning = 0.0  # no vector: it competes on its words alone
        else:
            meaning = (sim - low) / (high - low) if high > low else 1.0
        wording = c.text_share / share_high if share_high > 0 else 0.0
        c.fused = (1.0 - word_weight) * meaning + word_weight * wording
    dilation_floor(candidates)
    return word_weight


def dilation_floor(candidates: list[HybridCandidate]) -> None:
    """Lift each candidate to at least the fused score of the place DENSE_DILATION times its rank by plain cosine
    (the fused order before any lift; ties go to the nearer memory when ``hybrid_candidates`` sorts)."""
    dilation = tuning.DENSE_DILATION
    if dilation <= 0:
        return
    order = sorted((c.fused for c in candidates), reverse=True)
    nearest = sorted((c for c in candidates if c.has_vector), key=lambda c: -c.similarity)
    for rank, cand in enumerate(nearest, start=1):
        place = math.ceil(dilation * rank)
        if place > min(len(order), tuning.DENSE_DILATION_UPTO):
            break
        cand.fused = max(cand.fused, order[place - 1])
