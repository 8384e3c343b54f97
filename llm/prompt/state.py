"""The state of one build: the ``Draft`` (what is kept so far) and the ``BuildLog`` (what was cut, dropped and
degraded, the record the prompt's composition is made of)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm.prompt.budget import cut_to_budget
from llm.prompt.inputs import MemoryItem, TurnText
from llm.tokens import TokenCounter


@dataclass
class Draft:
    """The mutable state of one build: what is kept so far."""

    system_prompt: str
    procedural: list[str]
    memories: list[MemoryItem]
    summary: str
    turns: list[TurnText]
    turn_messages: dict[int, list[dict[str, Any]]]


@dataclass
class BuildLog:
    """What one build cut, dropped and degraded: the record ``composition`` is made of."""

    counter: TokenCounter
    cut_inputs: list[dict[str, Any]] = field(default_factory=list)
    procedural_dropped: list[dict[str, Any]] = field(default_factory=list)
    memories_dropped: list[dict[str, Any]] = field(default_factory=list)
    turns_dropped: list[dict[str, Any]] = field(default_factory=list)
    kept_unsummarized: list[int] = field(default_factory=list)
    degradations: list[str] = field(default_factory=list)
    simplified: int = 0
    summary_shortened: bool = False

    def note(self, name: str) -> None:
        if name not in self.degradations:
            self.degradations.append(name)

    def cut(self, text: str, section_budget: int, label: str) -> str:
        """``text`` cut to ``section_budget`` tokens (head and tail, a marker between), recorded when cut."""
        result, cut_tokens = cut_to_budget(text, section_budget, self.counter)
        if cut_tokens:
            self.cut_inputs.append(
                {
                    "input": label,
                    "original_tokens": self.counter.count(text),
                    "kept_tokens": self.counter.count(result),
                    "budget": section_budget,
                    "tokens_cut": cut_tokens,
                }
            )
        return result
