"""Tier 3: the relevance filter. The cheap model's batched scores when one is configured; else the
calibrated filter (the fused score, on the query's own scale, as a part of the query's best, kept from
RELATIVE_KEEP) or an operator's absolute cut-off on the stronger of cosine and word share. The model's
call failing, or answering later than its time budget, falls back to the calibrated or absolute filter."""

from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings

from memory.models import Memory
from memory.retrieval import tuning
from memory.retrieval.cheap import model_filter_available, model_scores
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
    if use_model_filter and fresh:
        try:
            if model_filter_available(agent):
                scores = model_scores(
                    agent=agent,
                    query=query,
                    memories=[loaded[c.memory_id] for c in fresh],
                    timeout=float(settings.MEMORY_RELEVANCE_TIMEOUT),
                )
                mode = "model"
        except concurrent.futures.TimeoutError:
            mode = f"{fallback} (model failed: no answer within {settings.MEMORY_RELEVANCE_TIMEOUT:g}s)"
        except Exception as exc:  # noqa: BLE001 - any provider failure must fall back, never break the turn
            # The report reaches the user (memory panel, API): the kind of failure only; its text is logged.
            mode = f"{fallback} (model failed: {type(exc).__name__})"
            logger.warning("relevance filter fell back to the %s filter: %s", fallback, exc)
    return scores, mode


@dataclass(frozen=True)
class Judge:
    """How a tier-2 candidate is judged: its relevance (kept from ``cut_off``) and the base of its rank score."""

    mode: str
    scores: dict[int, float]
    threshold: float | None
    best_fused: float  # the best fused score among the candidates tier 1 did not find (1.0 when none)
    cut_off: float
    source: str  # "model", "calibrated" or "threshold": named in the report's reasons


def judge_for(*, mode: str, scores: dict[int, float], threshold: float | None, fresh: list[HybridCandidate]) -> Judge:
    """The cut-off of this mode: 0.5 (or the threshold) on the model's scores; RELATIVE_KEEP on the
    calibrated relevance; the operator's threshold on the stronger of cosine and word share."""
    best_fused = max((c.fused for c in fresh), default=1.0) or 1.0
    if mode == "model":
        cut_off, source = (0.5 if threshold is None else threshold), "model"
    elif threshold is None:
        cut_off, source = tuning.RELATIVE_KEEP, "calibrated"
    else:
        cut_off, source = threshold, "threshold"
    return Judge(mode, scores, threshold, best_fused, cut_off, source)


def judged(judge: Judge, cand: HybridCandidate) -> tuple[float, float]:
    """The candidate's relevance and the base of its rank score."""
    if judge.mode == "model":
        relevance = judge.scores.get(cand.memory_id, 0.0)
        return relevance, relevance
    if judge.threshold is None:
        # Calibrated: the fused score, already on this query's own scale, as a part of its best's.
        return cand.fused / judge.best_fused, cand.fused / judge.best_fused
    # An operator's absolute cut-off: the stronger of meaning (cosine) and wording (word share).
    return max(cand.similarity, cand.text_share), cand.fused / judge.best_fused
