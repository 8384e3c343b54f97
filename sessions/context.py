"""A session's turns for a prompt: ``turn_history`` reads them once per turn (``TurnHistory``).

The prompt builder itself (budgets, sections, degradation, the pre-flight count) is the llm library's,
``llm.prompt``; its names are re-exported here for the callers that know them from this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm.prompt import (
    CUT_MARKER,
    DEFAULT_SHARES,
    HEADER_MEMORIES,
    HEADER_PROCEDURES,
    HEADER_SUMMARY,
    HEADER_WORKFLOW,
    MIN_TOOL_RESULT_TOKENS,
    MIN_TURNS,
    SECTIONS,
    SIMPLIFIED_SYSTEM_TOKENS,
    SUMMARY_SHORTENED_MARKER,
    SYSTEM_FLOOR_TOKENS,
    SYSTEM_SIMPLIFIED_MARKER,
    BuiltPrompt,
    ContextBudget,
    ContextOverflowError,
    MemoryItem,
    PromptInputs,
    TurnText,
    build_prompt,
    cut_to_budget,
    turn_tokens,
    window_size,
)
from sessions.models import ChatSession, Turn

__all__ = [
    "BuiltPrompt",
    "CUT_MARKER",
    "ContextBudget",
    "ContextOverflowError",
    "DEFAULT_SHARES",
    "HEADER_MEMORIES",
    "HEADER_PROCEDURES",
    "HEADER_SUMMARY",
    "HEADER_WORKFLOW",
    "MIN_TOOL_RESULT_TOKENS",
    "MIN_TURNS",
    "MemoryItem",
    "PromptInputs",
    "SECTIONS",
    "SIMPLIFIED_SYSTEM_TOKENS",
    "SUMMARY_SHORTENED_MARKER",
    "SYSTEM_FLOOR_TOKENS",
    "SYSTEM_SIMPLIFIED_MARKER",
    "TurnHistory",
    "TurnText",
    "build_prompt",
    "cut_to_budget",
    "recent_turns_for",
    "turn_history",
    "turn_tokens",
    "window_size",
]


@dataclass(frozen=True)
class TurnHistory:
    """A session's newest completed turns, read once for a turn: what its prompt draws on and what the
    summary check after it looks at.

    ``newest`` holds the completed turns before the turn (oldest first, at most ``max(cap, window)``, so
    every one when there are fewer); ``floor`` is the last seq the prompt leaves out.
    """

    newest: list[TurnText]
    floor: int
    truncated: bool = False  # the read stopped at its limit: older completed turns exist

    @property
    def for_prompt(self) -> list[TurnText]:
        """The window, plus any turns that left it but are not summarized yet."""
        return [t for t in self.newest if t.seq > self.floor]

    def newest_with(self, finished: TurnText, count: int) -> list[TurnText] | None:
        """The session's ``count`` newest completed turns once ``finished`` (the turn this history was read
        for) has completed too, oldest first; None when this read holds too few of them to tell."""
        if self.truncated and len(self.newest) < count - 1:
            return None
        return [*self.newest, finished][-count:] if count > 0 else []


def turn_history(*, session: ChatSession, before_seq: int | None = None, cap: int = 200) -> TurnHistory:
    """The newest completed turns (before ``before_seq``), in one query; see ``TurnHistory``."""
    window = max(session.agent.window_turns, MIN_TURNS)
    turns = Turn.objects.filter(session=session, status=Turn.Status.COMPLETED)
    if before_seq is not None:
        turns = turns.filter(seq__lt=before_seq)
    # A plain query and a filter in Python: deciding the floor in SQL (a subquery for the newest seq) read
    # fewer rows but cost more in Django's query compiler than the rows it saved (2.9 vs 2.1 ms).
    limit = max(cap, window)
    rows = list(turns.order_by("-seq").values_list("seq", "user_message", "assistant_message")[:limit])
    newest = [TurnText(seq=s, user=u, assistant=a) for s, u, a in reversed(rows)]
    floor = min(session.summary_through_seq, newest[-1].seq - window) if newest else 0
    return TurnHistory(newest=newest, floor=floor, truncated=len(rows) == limit)


def recent_turns_for(*, session: ChatSession, before_seq: int | None = None, cap: int = 200) -> list[TurnText]:
    """The completed turns a prompt may draw on: the window, plus any that left it but are not summarized yet.

    Oldest first, at most ``cap`` (a summary far behind must not load the whole history).
    """
    return turn_history(session=session, before_seq=before_seq, cap=cap).for_prompt
