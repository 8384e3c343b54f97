"""Tier 4: rank by relevance, importance and recency (when it happened), and keep at most MEMORY_MAX_KEPT
memories within the memory token budget; every candidate's report says why it was kept or dropped."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings

from memory.models import Memory
from memory.retrieval import tuning
from memory.retrieval.relevance import Judge, judged
from memory.retrieval.result import CandidateReport, HybridCandidate, RetrievedMemories, RetrievedMemory

# (rank score, candidate, relevance, report, whether it passed the filter: not only its floor)
Ranked = tuple[float, HybridCandidate, float, CandidateReport, bool]


def prompt_text(memory: Memory) -> str:
    """A memory as it is shown to the model: episodes and facts carry the date they happened (or were
    learned), so "when" questions can be answered and old news told from new."""
    if memory.kind == Memory.Kind.PROCEDURAL:
        return memory.text
    return f"({memory.occurred_at:%Y-%m-%d}) {memory.text}"


def recency(memory: Memory, now: datetime) -> float:
    age_days = max(0.0, (now - memory.occurred_at).total_seconds() / 86400)
    return 0.5 ** (age_days / tuning.RECENCY_HALF_LIFE_DAYS)


def rank_score(base: float, memory: Memory, now: datetime) -> float:
    return (
        tuning.WEIGHT_RELEVANCE * base
        + tuning.WEIGHT_IMPORTANCE * memory.importance
        + tuning.WEIGHT_RECENCY * recency(memory, now)
    )


def rank(
    result: RetrievedMemories,
    *,
    tier1: list[tuple[Memory, str]],
    fused: list[HybridCandidate],
    loaded: dict[int, Memory],
    judge: Judge,
    counter: Any,
    now: datetime,
) -> None:
    """Fill ``result`` with the kept memories (best first), every candidate's report and the tokens used."""
    reports: list[CandidateReport] = []
    tier1_reports: dict[int, CandidateReport] = {}
    for memory, reason in tier1:
        report = CandidateReport(
            id=memory.id, kind=memory.kind, preview=memory.text[: tuning.PREVIEW_CHARS], tier=1, reason=reason
        )
        tier1_reports[memory.id] = report
        reports.append(report)
    ranked = _ranked(fused, loaded=loaded, tier1_reports=tier1_reports, reports=reports, judge=judge, now=now)
    used = _keep_tier1(
        result, tier1=tier1, tier1_reports=tier1_reports, fused=fused, judge=judge, counter=counter, now=now
    )
    used = _keep_ranked(result, ranked=ranked, loaded=loaded, judge=judge, counter=counter, used=used)
    # Profile facts and pinned memories first (1.0), then the relevant ones and the recent actions by score.
    result.items.sort(key=lambda item: (item.score < 1.0, -item.score))
    result.candidates = reports
    result.total_tokens = used


def _ranked(
    fused: list[HybridCandidate],
    *,
    loaded: dict[int, Memory],
    tier1_reports: dict[int, CandidateReport],
    reports: list[CandidateReport],
    judge: Judge,
    now: datetime,
) -> list[Ranked]:
    """The tier-2 candidates past the relevance cut-off (and, calibrated, within the store's meaning gap), best
    rank score first (each reported in ``reports``). The calibrated filter also passes the first
    CALIBRATED_KEEP_AT_LEAST of them by fused score (those tier 1 did not take, in the turn's scope) whatever
    their relevance; they rank after every relevant one."""
    ranked: list[Ranked] = []
    floor = tuning.CALIBRATED_KEEP_AT_LEAST if judge.source == "calibrated" else 0
    place = 0  # the candidate's place among the fresh ones, by fused score
    for cand in fused:
        if cand.memory_id in tier1_reports:
            # Each memory is reported once: tier 1's entry, with what tier 2 found too.
            tier1_reports[cand.memory_id].scored_by(cand)
            continue
        outside = judge.outside.get(cand.memory_id)
        place += outside is None  # the floor passes only candidates in the turn's scope
        memory = loaded[cand.memory_id]
        report = CandidateReport(id=memory.id, kind=memory.kind, preview=memory.text[: tuning.PREVIEW_CHARS], tier=2)
        report.scored_by(cand)
        relevance, base_score = judged(judge, cand)
        report.relevance = relevance
        reports.append(report)
        far = judge.far_in_meaning(cand)
        passed = relevance >= judge.cut_off and far is None
        if not passed and (place > floor or outside is not None):
            report.reason = f"below the {judge.source} relevance cut-off {judge.cut_off:.2f}"
            if far is not None and relevance >= judge.cut_off:
                report.reason = (
                    f"far in meaning: its cosine is {far:.2f} below the best match's "
                    f"(more than the {judge.meaning_gap:.2f} this store allows)"
                )
            if outside is not None:
                report.reason += f" (a {outside} chat, outside this workflow: weighed ×{judge.scope(memory.id):g})"
            continue
        ranked.append((rank_score(base_score, memory, now), cand, relevance, report, passed))
    ranked.sort(key=lambda r: (not r[4], -r[0]))
    return ranked


def _keep_tier1(
    result: RetrievedMemories,
    *,
    tier1: list[tuple[Memory, str]],
    tier1_reports: dict[int, CandidateReport],
    fused: list[HybridCandidate],
    judge: Judge,
    counter: Any,
    now: datetime,
) -> int:
    """Keep tier 1 within the budget, in order; returns the tokens used.

    A recent action is kept (what the user was doing last time) but is not "needed to answer": it gets the
    rank score a tier-2 candidate would (its fused score on this query's scale, importance, recency) and its
    place among the relevant ones by that score, not 1.0 and first. Profile facts and pinned ones stay 1.0."""
    fused_of = {c.memory_id: c.fused for c in fused}
    used = 0
    for memory, reason in tier1:
        text = prompt_text(memory)
        tokens = counter.count(text)
        report = tier1_reports[memory.id]
        if used + tokens > result.budget_tokens:
            report.reason += "; over the memory budget"
            continue
        used += tokens
        report.kept = True
        score = 1.0
        if reason == "recent action":
            score = rank_score(min(1.0, fused_of.get(memory.id, 0.0) / judge.best_fused), memory, now)
        result.items.append(RetrievedMemory(memory=memory, text=text, score=score, tier=1, tokens=tokens))
    return used


def _keep_ranked(
    result: RetrievedMemories, *, ranked: list[Ranked], loaded: dict[int, Memory], judge: Judge, counter: Any, used: int
) -> int:
    """Keep the ranked tier-2 candidates, best first, up to MEMORY_MAX_KEPT in all (the calibrated filter and
    the reranker: at most CALIBRATED_MAX_KEPT of tier 2) and the budget; each kept one's reason says why it is
    in."""
    most = int(settings.MEMORY_MAX_KEPT)
    # The cap holds under the reranker too: its picks rank first, the calibrated filter judges the rest.
    most_fresh = tuning.CALIBRATED_MAX_KEPT if judge.source in ("calibrated", "rerank") else most
    fresh = 0
    for score, cand, relevance, report, relevant in ranked:
        memory = loaded[cand.memory_id]
        passed = "relevant" if relevant else f"among the first {tuning.CALIBRATED_KEEP_AT_LEAST}"
        if len(result.items) >= most:
            report.reason = f"{passed} ({relevance:.2f}) but past the {most} memories a prompt takes"
            continue
        if fresh >= most_fresh:
            report.reason = f"{passed} ({relevance:.2f}) but past the {most_fresh} the {judge.source} filter keeps"
            continue
        text = prompt_text(memory)
        tokens = counter.count(text)
        if used + tokens > result.budget_tokens:
            report.reason = f"{passed} ({relevance:.2f}) but over the memory budget"
            continue
        used += tokens
        fresh += 1
        report.kept = True
        report.reason = kept_reason(report, judge=judge, relevance=relevance, relevant=relevant, score=score)
        result.items.append(RetrievedMemory(memory=memory, text=text, score=score, tier=2, tokens=tokens))
    return used


def kept_reason(report: CandidateReport, *, judge: Judge, relevance: float, relevant: bool, score: float) -> str:
    """Why a tier-2 memory is in the prompt, in the inspector's words: what it matched the query on (meaning,
    words), how it stands against the best match, and whether it came in on the filter's floor."""
    matched = []
    if report.cosine is not None:
        matched.append(f"meaning {report.cosine:.2f}")
    if report.word_share:
        matched.append(f"words {report.word_share:.2f}")
    if report.cosine is None and not report.word_share:
        matched.append("next to a strong match in its chat")
    how = ", ".join(matched)
    if judge.source == "calibrated":
        standing = "the best match" if relevance >= 0.999 else f"{relevance:.2f} of the best match's score"
    else:
        standing = f"{judge.source} {relevance:.2f}"
    if relevant:
        return f"relevant: {standing} ({how}), rank score {score:.3f}"
    return (
        f"among the first {tuning.CALIBRATED_KEEP_AT_LEAST} candidates though below the cut: {standing} ({how}), "
        f"rank score {score:.3f}"
    )
