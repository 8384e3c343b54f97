"""What retrieval returns: the memories for the prompt, the report of every candidate, and tier 2's
candidates as fusion scores them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memory.models import Memory
from memory.retrieval import tuning


@dataclass
class RetrievedMemory:
    memory: Memory
    text: str  # as it goes into the prompt
    score: float
    tier: int
    tokens: int


@dataclass
class CandidateReport:
    id: int
    kind: str
    preview: str
    tier: int
    vector_rank: int | None = None
    text_rank: int | None = None
    fused_score: float = 0.0
    relevance: float | None = None
    kept: bool = False
    reason: str = ""
    # What the fused score is made of (tier 2): the cosine to the query, the crowding it lost HUB_WEIGHT of,
    # and the idf-weighted share of the query's words. None where tier 2 did not score the memory.
    cosine: float | None = None
    crowding: float | None = None
    word_share: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "preview": self.preview,
            "tier": self.tier,
            "vector_rank": self.vector_rank,
            "text_rank": self.text_rank,
            "fused_score": round(self.fused_score, 6),
            "relevance": None if self.relevance is None else round(self.relevance, 4),
            "kept": self.kept,
            "reason": self.reason,
            "cosine": None if self.cosine is None else round(self.cosine, 4),
            "crowding": None if self.crowding is None else round(self.crowding, 4),
            "word_share": None if self.word_share is None else round(self.word_share, 4),
        }

    def scored_by(self, cand: HybridCandidate) -> None:
        self.vector_rank, self.text_rank, self.fused_score = cand.vector_rank, cand.text_rank, cand.fused
        if cand.scored is not None:  # None: only a neighbour of a strong candidate (a share of that one's score)
            self.cosine, self.crowding, self.word_share = cand.scored


@dataclass
class RetrievedMemories:
    items: list[RetrievedMemory] = field(default_factory=list)
    procedural: list[Memory] = field(default_factory=list)
    candidates: list[CandidateReport] = field(default_factory=list)
    total_tokens: int = 0
    budget_tokens: int = 0
    filter_mode: str = "calibrated"
    degraded: str = ""  # why a part of the search was skipped (the query's embedding failed), or empty
    query: str = ""  # the text searched for (see retrieval_query)
    query_source: str = "message"
    timings_ms: dict[str, float] = field(default_factory=dict)
    word_weight: float | None = None  # the word arm's share of the fused score, earned on this query (tier 2)
    redundancy: float | None = None  # how much the user's memories look alike (tier 2, "cc"; redundancy.py)
    corrections: float | None = None  # the share of the word arm and hubness correction that redundancy earned
    hub_weight: float | None = None  # what a candidate's crowding was taken off its cosine times (tier 2, "cc")

    def as_report(self) -> dict[str, Any]:
        """JSON-able summary for ``Turn.retrieval``, the inspector and the API."""
        return {
            "query": self.query,
            "query_source": self.query_source,
            "items": [
                {
                    "id": i.memory.id,
                    "kind": i.memory.kind,
                    "tier": i.tier,
                    "score": round(i.score, 4),
                    "tokens": i.tokens,
                }
                for i in self.items
            ],
            "procedural": [
                {"id": m.id, "trigger": m.trigger, "preview": m.text[: tuning.PREVIEW_CHARS]} for m in self.procedural
            ],
            "candidates": [c.as_dict() for c in self.candidates],
            "total_tokens": self.total_tokens,
            "budget_tokens": self.budget_tokens,
            "filter_mode": self.filter_mode,
            "degraded": self.degraded,
            "word_weight": None if self.word_weight is None else round(self.word_weight, 4),
            "redundancy": None if self.redundancy is None else round(self.redundancy, 4),
            "corrections": None if self.corrections is None else round(self.corrections, 4),
            "hub_weight": None if self.hub_weight is None else round(self.hub_weight, 4),
            "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items()},
        }


@dataclass
class HybridCandidate:
    memory_id: int
    vector_rank: int | None = None
    text_rank: int | None = None
    similarity: float = 0.0  # cosine similarity to the query
    crowding: float = 0.0  # mean cosine to its HUB_K nearest fellow candidates (hubness; see HUB_WEIGHT)
    has_vector: bool = True  # a memory not embedded yet has no meaning to compare: the word arm found it
    # What fusion scored it on, for the report (cosine, crowding, word share), before a neighbour's share of
    # another candidate's score raised any of them; None where it was not measured.
    scored: tuple[float | None, float | None, float] | None = None
    text_share: float = 0.0  # idf-weighted share of the query's words the memory contains
    fused: float = 0.0
