"""Structured outputs the memory app asks models for (validated pydantic objects, never free text)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Fact(BaseModel):
    """One durable fact about the user, e.g. key="home_airport", text="The user's home airport is LIS"."""

    key: str = Field(default="", max_length=80, description="snake_case name of the attribute, '' if none")
    text: str = Field(min_length=1, max_length=500, description="the fact as one short sentence about the user")
    confidence: float = Field(ge=0.0, le=1.0, description="how sure the user stated it (1.0 = explicit)")


class ExtractedFacts(BaseModel):
    facts: list[Fact] = Field(default_factory=list, max_length=20)


class RelevanceScore(BaseModel):
    id: int
    score: float = Field(ge=0.0, le=1.0, description="1.0 = needed to answer, 0.0 = unrelated")


class RelevanceScores(BaseModel):
    scores: list[RelevanceScore] = Field(default_factory=list)


class RankedMemories(BaseModel):
    """The listwise reranker's answer: the numbers of the memories that help, most helpful first."""

    order: list[int] = Field(
        default_factory=list,
        max_length=100,
        description="numbers of the memories that help answer, most helpful first; leave out the rest",
    )


class SearchQuery(BaseModel):
    query: str = Field(max_length=500, description="the standalone search query")
