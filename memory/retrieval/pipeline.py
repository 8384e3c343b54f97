"""The retriever every door uses (runtime, API, admin, the search_memory tool), stage by stage:

1. exact lookups (``exact``): the user's profile facts (semantic, with a ``fact_key``), pinned memories,
   recent actions;
2. hybrid candidates for this user only (``hybrid``): cosine search (``vector``: exact for histories under
   MEMORY_EXACT_SEARCH_MAX; above it the user's own partial HNSW index, or the shared one with pgvector 0.8
   iterative scans so the user filter cannot starve it) and idf-weighted full-text search (``words``),
   fused on the query's own scale, with the episodes next to the best candidates in their chat session
   pulled in (``neighbours``);
3. a relevance filter (``relevance``): one batched cheap-model call scoring every candidate, or the
   calibrated filter (on the query's own scale) when no model is configured, the call fails, or it is
   slower than its time budget, or an operator's absolute cut-off;
4. ranking by relevance, importance and recency (when it happened), at most MEMORY_MAX_KEPT memories and
   the memory token budget (``rank``).

The query is the message, or what ``query.retrieval_query`` makes of it with the conversation. Episodes of
the turns the prompt shows (``RecentWindow``) are left out. docs/memory.md has the measurements.

Every query here filters on the requesting user: no path returns another user's memory (shared
procedures, with no user, are everyone's).
"""

from __future__ import annotations

import concurrent.futures
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from llm.tokens import counter_for
from memory.embedding import get_embedder
from memory.models import Memory
from memory.retrieval import tuning
from memory.retrieval.exact import PROCEDURE, exact_lookups, tier1_from, trigger_matches
from memory.retrieval.hybrid import hybrid_candidates
from memory.retrieval.query import query_vector_soon, query_vector_wait
from memory.retrieval.rank import rank
from memory.retrieval.redundancy import store_shape
from memory.retrieval.relevance import Judge, judge_for, relevance_scores, scope_weights
from memory.retrieval.result import HybridCandidate, RetrievedMemories
from memory.retrieval.sql import RecentWindow
from memory.retrieval.vector import is_small_history
from memory.retrieval.words import word_candidates
from memory.services import memories_touch

if TYPE_CHECKING:
    from agents.models import Agent


def memories_for_prompt(
    *,
    user: Any,
    query: str,
    agent: Agent | None = None,
    workflow: str = "",
    budget_tokens: int,
    relevance_threshold: float | None = None,
    use_model_filter: bool = True,
    now: datetime | None = None,
    query_vector: list[float] | None = None,
    touch: bool = True,
    window: RecentWindow | None = None,
) -> RetrievedMemories:
    """The memories of ``user`` worth putting into a prompt about ``query``, ranked and cut to
    ``budget_tokens``, with a report of every candidate (each memory once) and why it was kept or dropped.

    Only ``user``'s own current memories are considered (plus shared procedures); episodes of the turns in
    ``window`` (the prompt shows those turns already) are left out. The relevance filter is the cheap
    model's batched scores when one is configured (kept from ``relevance_threshold``, 0.5 when None), else
    the calibrated default (None: the fused score as a part of the query's best, kept from RELATIVE_KEEP)
    or an absolute cut-off on the stronger of cosine and word share (a number: an operator's choice; 0
    keeps everything). Accessed memories get their access
    count and last access time updated, unless ``touch`` is false: the runtime leaves that to the turn's
    memory-write task, off the request path (``memory.services.turn_memories_write``). ``query_vector``
    skips embedding the query (when the caller has it already).
    """
    started_total = time.perf_counter()
    now = now or timezone.now()
    result = RetrievedMemories(budget_tokens=budget_tokens, query=query)
    timings = result.timings_ms
    if user is None or not getattr(user, "pk", None):
        return result
    counter = counter_for((agent.model if agent else "") or settings.LLM_MODEL or "")

    # The query's vector is computed on another thread while tier 1, the size of the history and the word
    # arm of tier 2 are read here (the model and the database both let go of the GIL): the embedding is
    # the longest step, and only the vector arm and the candidates' rows wait for it.
    started = time.perf_counter()
    pending = query_vector_soon(query, query_vector)  # None: no vector for a blank query
    tier1 = _exact_tier(result, user=user, query=query, now=now, agent=agent, workflow=workflow, window=window)
    timings["tier1"] = (time.perf_counter() - started) * 1000

    fused: list[HybridCandidate] = []
    loaded: dict[int, Memory] = {}
    workflows: dict[int, str] = {}
    if pending is not None:
        fused, loaded, workflows = _hybrid_tier(result, pending, user=user, query=query, now=now, window=window)

    started = time.perf_counter()
    seen = {memory.id for memory, _ in tier1}
    fresh = [c for c in fused if c.memory_id not in seen]
    judge = _relevance_tier(
        result,
        fresh=fresh,
        loaded=loaded,
        agent=agent,
        use_model_filter=use_model_filter,
        relevance_threshold=relevance_threshold,
        outside=scope_weights(workflow=workflow, fresh=fresh, workflows=workflows),
        corrections=result.corrections,
    )
    timings["filter"] = (time.perf_counter() - started) * 1000

    started = time.perf_counter()
    rank(result, tier1=tier1, fused=fused, loaded=loaded, judge=judge, counter=counter, now=now)
    timings["rank"] = (time.perf_counter() - started) * 1000

    if touch:
        memories_touch(memory_ids=[i.memory.id for i in result.items], now=now)
    timings["total"] = (time.perf_counter() - started_total) * 1000
    return result


def _exact_tier(
    result: RetrievedMemories,
    *,
    user: Any,
    query: str,
    now: datetime,
    agent: Agent | None,
    workflow: str,
    window: RecentWindow | None,
) -> list[tuple[Memory, str]]:
    """Tier 1: profile facts, pinned memories, recent actions and the candidate procedures (one query); the
    procedures whose trigger the query matches go into ``result``."""
    grouped = exact_lookups(user=user, now=now, agent=agent, workflow=workflow, window=window)
    result.procedural = [m for m in grouped[PROCEDURE] if trigger_matches(m.trigger, query)]
    return tier1_from(grouped)


def _hybrid_tier(
    result: RetrievedMemories,
    pending: concurrent.futures.Future[list[float]],
    *,
    user: Any,
    query: str,
    now: datetime,
    window: RecentWindow | None,
) -> tuple[list[HybridCandidate], dict[int, Memory], dict[int, str]]:
    """Tier 2: the history's size, the store's shape (``redundancy``) and the word arm while the query is
    embedded, then the vector arm, fusion and the candidates' rows. Its time in the timings leaves out the wait for the vector."""
    timings = result.timings_ms
    started = time.perf_counter()
    small = is_small_history(user.pk)
    timings["history_size"] = (time.perf_counter() - started) * 1000
    store = store_shape(user.pk) if tuning.FUSION == "cc" else None
    timings["redundancy"] = (time.perf_counter() - started) * 1000 - timings["history_size"]
    corrections = 1.0 if store is None else store.corrections
    words = word_candidates(user_id=user.pk, query=query, now=now, window=window, corrections=corrections)
    tier2_ms = (time.perf_counter() - started) * 1000
    timings["text_search"] = tier2_ms - timings["history_size"] - timings["redundancy"]
    started = time.perf_counter()
    vector, degraded = query_vector_wait(pending)
    if degraded:
        result.degraded = degraded
    timings["embed_wait"] = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    search = hybrid_candidates(
        user=user, query=query, vector=vector, now=now, small=small, words=words, window=window, store=store
    )
    result.word_weight = search.word_weight
    result.redundancy, result.corrections, result.hub_weight = search.redundancy, search.corrections, search.hub_weight
    timings.update(search.timings)
    timings["tier2"] = tier2_ms + (time.perf_counter() - started) * 1000  # without the wait for the vector
    return search.candidates, search.rows, search.workflows


def _relevance_tier(
    result: RetrievedMemories,
    *,
    fresh: list[HybridCandidate],
    loaded: dict[int, Memory],
    agent: Agent | None,
    use_model_filter: bool,
    relevance_threshold: float | None,
    outside: dict[int, str],
    corrections: float | None,
) -> Judge:
    """Tier 3: the filter mode (and the model's scores) for the candidates tier 1 did not find; ``outside``:
    those out of the turn's scope (``scope_weights``)."""
    scores, mode = relevance_scores(
        agent=agent,
        query=result.query,
        fresh=fresh,
        loaded=loaded,
        use_model_filter=use_model_filter,
        relevance_threshold=relevance_threshold,
    )
    result.filter_mode = mode
    return judge_for(
        mode=mode, scores=scores, threshold=relevance_threshold, fresh=fresh, outside=outside, corrections=corrections
    )


def memory_search(*, user: Any, query: str, limit: int = 20, now: datetime | None = None) -> list[Memory]:
    """Hybrid (vector + full-text) search over one user's current memories, best first (tier 2 alone, no
    ranking or budget). The admin's ``~`` search is plain cosine over its filtered list; this is for code
    that wants the hybrid order without a prompt budget."""
    now = now or timezone.now()
    if user is None or not getattr(user, "pk", None) or not query.strip():
        return []
    vector = get_embedder().embed_query(query)
    search = hybrid_candidates(user=user, query=query, vector=vector, now=now, limit=limit)
    return [search.rows[c.memory_id] for c in search.candidates][:limit]
