"""Tier 3: the relevance filter. When a cheap model is configured, one call judges the best candidates:
listwise by default (``MEMORY_MODEL_JUDGE = "rerank"``: it orders the memories that help, and the order is
the rank), or pointwise (``"scores"``: a score for each). Else the calibrated filter (the fused score, on the
query's own scale, as a part of the query's best, kept from RELATIVE_KEEP) or an operator's absolute
cut-off on the stronger of cosine and word share. The model's call failing, answering later than its time
budget, or expected to (``RerankPace``), falls back to the calibrated or absolute filter.

Under "rerank" the model promotes and orders; it does not drop: a candidate it leaves out is judged as the
fallback filter would, below every memory it listed. A weak model can so reorder the top, never empty it."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.conf import settings

from memory.models import Memory
from memory.retrieval import tuning
from memory.retrieval.cheap import cheap_model_key, model_filter_available, model_order, model_scores, rerank_prompt
from memory.retrieval.result import HybridCandidate

if TYPE_CHECKING:
    from agents.models import Agent

logger = logging.getLogger(__name__)


def relevance_scores(
    *,
    agent: Agent | None,
    query: str,
    fresh: list[HybridCandidate],
    loaded: dict[int, Memory],
    use_model_filter: bool,
    relevance_threshold: float | None,
) -> tuple[dict[int, float], str]:
    """The cheap model's scores of the ``fresh`` candidates and the filter mode: "model", or the fallback
    ("calibrated" or "threshold", with why the model's scores are missing where it was asked)."""
    scores: dict[int, float] = {}
    fallback = "calibrated" if relevance_threshold is None else "threshold"
    mode = fallback
    timeout = float(settings.MEMORY_RELEVANCE_TIMEOUT)
    if use_model_filter and fresh:
        try:
            if model_filter_available(agent) and settings.MEMORY_MODEL_JUDGE == "rerank":
                memories = [loaded[c.memory_id] for c in fresh[: tuning.RERANK_CANDIDATES]]
                scores, mode = _reranked(
                    agent=agent, query=query, memories=memories, timeout=timeout, fallback=fallback
                )
            elif settings.MEMORY_MODEL_JUDGE == "scores" and model_filter_available(agent):
                memories = [loaded[c.memory_id] for c in fresh]
                scores = model_scores(agent=agent, query=query, memories=memories, timeout=timeout)
                mode = "model"
        except concurrent.futures.TimeoutError:
            mode = f"{fallback} (model failed: no answer within {settings.MEMORY_RELEVANCE_TIMEOUT:g}s)"
        except Exception as exc:  # noqa: BLE001 - any provider failure must fall back, never break the turn
            # The report reaches the user (memory panel, API): the kind of failure only; its text is logged.
            mode = f"{fallback} (model failed: {type(exc).__name__})"
            logger.warning("relevance filter fell back to the %s filter: %s", fallback, exc)
    return scores, mode


@dataclass
class RerankPace:
    """How long the reranker's calls take on one endpoint, to skip a call that would not answer within its
    budget: an average of the seconds per prompt character of the last calls (RERANK_PACE_WEIGHT on the
    newest). A call expected to run past the budget is not made, except one every RERANK_RETRY_SECONDS, so
    a model that got faster (or a first slow call on a cold server) is found again."""

    seconds_per_char: float | None = None
    last_try: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def expected(self, chars: int) -> float | None:
        return None if self.seconds_per_char is None else self.seconds_per_char * chars

    def should_try(self, chars: int, budget: float, now: float) -> bool:
        expected = self.expected(chars)
        return expected is None or expected <= budget or now - self.last_try >= tuning.RERANK_RETRY_SECONDS

    def record(self, chars: int, seconds: float) -> None:
        rate = seconds / max(chars, 1)
        with self.lock:
            weight = tuning.RERANK_PACE_WEIGHT
            old = self.seconds_per_char
            self.seconds_per_char = rate if old is None else (1 - weight) * old + weight * rate


_PACES: dict[str, RerankPace] = {}
_PACES_LOCK = threading.Lock()


def rerank_pace(key: str) -> RerankPace:
    with _PACES_LOCK:
        return _PACES.setdefault(key, RerankPace())


def _reranked(
    *, agent: Agent | None, query: str, memories: list[Memory], timeout: float, fallback: str
) -> tuple[dict[int, float], str]:
    """The listwise reranker's scores (1.0 for its first pick down to just over 0.5 for its last) and the
    mode, or no scores and the fallback's mode when the call is expected to run past its budget."""
    messages = rerank_prompt(query, memories)
    chars = sum(len(str(m["content"])) for m in messages)
    pace = rerank_pace(cheap_model_key(agent))
    now = time.monotonic()
    if not pace.should_try(chars, timeout, now):
        expected = pace.expected(chars) or 0.0
        return {}, f"{fallback} (reranker off: about {expected:.1f}s expected, budget {timeout:g}s)"
    pace.last_try = now
    try:
        order = model_order(agent=agent, messages=messages, memories=memories, timeout=timeout)
    except concurrent.futures.TimeoutError:
        pace.record(chars, max(timeout, time.monotonic() - now))
        raise
    pace.record(chars, time.monotonic() - now)
    return {memory_id: 1.0 - 0.5 * place / len(order) for place, memory_id in enumerate(order)}, "rerank"


def scope_weights(*, workflow: str, fresh: list[HybridCandidate], workflows: dict[int, str]) -> dict[int, str]:
    """The candidates outside the scope of a turn of ``workflow``: the episodes of chat sessions of another
    workflow (a booking turn and the small talk of the user's free chats), by id, with that workflow.

    Facts, procedures and episodes of no session (an import, the API) are in every scope; a turn with no
    workflow, or an open one (SCOPE_OPEN_WORKFLOWS: free chat, where anything the user said may matter),
    has no scope."""
    if workflow in tuning.SCOPE_OPEN_WORKFLOWS:
        return {}
    return {c.memory_id: workflows[c.memory_id] for c in fresh if workflows.get(c.memory_id, workflow) != workflow}


@dataclass(frozen=True)
class Judge:
    """How a tier-2 candidate is judged: its relevance (kept from ``cut_off``) and the base of its rank score."""

    mode: str
    scores: dict[int, float]
    threshold: float | None
    best_fused: float  # the best fused score among the candidates tier 1 did not find (1.0 when none)
    cut_off: float
    source: str  # "model", "rerank", "calibrated" or "threshold": named in the report's reasons
    outside: dict[int, str] = field(default_factory=dict)  # out of the turn's scope: id -> its session's workflow
    best_cosine: float | None = None  # the best cosine among the candidates tier 1 did not find
    meaning_gap: float | None = None  # calibrated: how far below best_cosine a relevant candidate may be

    def scope(self, memory_id: int) -> float:
        """What the candidate's relevance is weighed by: SCOPE_OUTSIDE_WEIGHT outside the turn's scope."""
        return tuning.SCOPE_OUTSIDE_WEIGHT if memory_id in self.outside else 1.0

    def far_in_meaning(self, cand: HybridCandidate) -> float | None:
        """How far the candidate's cosine lies below the best candidate's, where that is more than the meaning
        gap (None: within it, no gap in this store, or a candidate with no cosine of its own)."""
        cosine = cand.scored[0] if cand.scored is not None else None
        if self.meaning_gap is None or self.best_cosine is None or cosine is None:
            return None
        below = self.best_cosine - cosine
        return below if below > self.meaning_gap else None


def meaning_gap(corrections: float | None) -> float | None:
    """The calibrated filter's meaning gap in a store with this share of the corrections (``redundancy``):
    MEANING_GAP in a store of independent facts, where the cosine already points at the memory, wider as the
    store grows redundant, none in a store that gets the corrections whole (its lookalikes crowd the best
    cosine: there the fused score, not the cosine, tells them apart) or where fusion does not measure it."""
    if corrections is None or corrections >= 1.0 or tuning.MEANING_GAP <= 0:
        return None
    return tuning.MEANING_GAP / (1.0 - corrections)


def judge_for(
    *,
    mode: str,
    scores: dict[int, float],
    threshold: float | None,
    fresh: list[HybridCandidate],
    outside: dict[int, str] | None = None,
    corrections: float | None = None,
) -> Judge:
    """The cut-off of this mode: 0.5 (or the threshold) on the model's scores; RELATIVE_KEEP on the
    calibrated relevance, with the store's meaning gap (``meaning_gap`` of its ``corrections``); the
    operator's threshold on the stronger of cosine and word share. Under "rerank" the fallback's cut-off,
    halved: a memory the reranker left out scores half its fallback relevance."""
    best_fused = max((c.fused for c in fresh), default=1.0) or 1.0
    cosines = [c.scored[0] for c in fresh if c.scored is not None and c.scored[0] is not None]
    best_cosine = max(cosines, default=None)
    if mode == "model":
        cut_off, source = (0.5 if threshold is None else threshold), "model"
    elif mode == "rerank":
        cut_off, source = 0.5 * (tuning.RELATIVE_KEEP if threshold is None else threshold), "rerank"
    elif threshold is None:
        cut_off, source = tuning.RELATIVE_KEEP, "calibrated"
    else:
        cut_off, source = threshold, "threshold"
    gap = meaning_gap(corrections) if source == "calibrated" else None
    return Judge(mode, scores, threshold, best_fused, cut_off, source, outside or {}, best_cosine, gap)


def judged(judge: Judge, cand: HybridCandidate) -> tuple[float, float]:
    """The candidate's relevance and the base of its rank score, weighed by the turn's scope."""
    relevance, base = _judged(judge, cand)
    weight = judge.scope(cand.memory_id)
    return weight * relevance, weight * base


def _judged(judge: Judge, cand: HybridCandidate) -> tuple[float, float]:
    if judge.mode == "model":
        relevance = judge.scores.get(cand.memory_id, 0.0)
        return relevance, relevance
    if judge.mode == "rerank":
        picked = judge.scores.get(cand.memory_id)
        if picked is not None:
            return picked, picked
        relevance, base = _fallback_judged(judge, cand)
        return 0.5 * relevance, 0.5 * base
    return _fallback_judged(judge, cand)


def _fallback_judged(judge: Judge, cand: HybridCandidate) -> tuple[float, float]:
    if judge.threshold is None:
        # Calibrated: the fused score, already on this query's own scale, as a part of its best's.
        return cand.fused / judge.best_fused, cand.fused / judge.best_fused
    # An operator's absolute cut-off: the stronger of meaning (cosine) and wording (word share).
    return max(cand.similarity, cand.text_share), cand.fused / judge.best_fused
