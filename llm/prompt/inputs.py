"""What a prompt is made of: ``PromptInputs``, with the memories (``MemoryItem``) and past turns (``TurnText``)
it may hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MemoryItem:
    id: int | str
    text: str
    score: float = 0.0
    kind: str = ""


@dataclass(frozen=True)
class TurnText:
    seq: int
    user: str
    assistant: str


@dataclass
class PromptInputs:
    """Everything a prompt is made of. Memories are ranked best first; turns oldest first."""

    system_prompt: str
    message: str
    workflow_text: str = ""
    procedural: list[str] = field(default_factory=list)
    memories: list[MemoryItem] = field(default_factory=list)
    summary: str = ""
    recent_turns: list[TurnText] = field(default_factory=list)
    tool_messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    fixed_instructions: str = ""
    # The last turn folded into ``summary``. Turns past the window but not yet summarized are kept
    # (the window stretches) rather than lost; None means unknown: the window is applied strictly.
    summary_through_seq: int | None = None
