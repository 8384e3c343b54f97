"""Token budgets: how many tokens a prompt may use and each section's share (``ContextBudget``), the error when even
the degraded prompt is over it, the sliding window of past turns, and one input cut to its own budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llm.base import LLMConfigurationError
from llm.continuation import default_reply_tokens
from llm.prompt.inputs import TurnText
from llm.providers import endpoint_window
from llm.sections import DEFAULT_SHARES
from llm.tokens import TOKENS_PER_MESSAGE, TokenCounter

if TYPE_CHECKING:
    # Any object with an agent's budget fields (``agents.models.Agent``); the library has no ORM.
    Agent = Any

SECTIONS: tuple[str, ...] = ("system", "workflow", "procedural", "memories", "summary", "recent", "message", "tools")
MIN_TURNS = 3

CUT_MARKER = "[… {cut:,} tokens cut: the input exceeded its {budget:,}-token budget …]"


class ContextOverflowError(Exception):
    """Even the fully degraded prompt is over budget. The message names every section and its size."""

    def __init__(self, *, total: int, limit: int, sections: Mapping[str, int], degradations: Sequence[str]) -> None:
        self.total = total
        self.limit = limit
        self.sections = dict(sections)
        self.degradations = list(degradations)
        sizes = ", ".join(f"{name}={tokens}" for name, tokens in self.sections.items())
        tried = ", ".join(self.degradations) or "none"
        super().__init__(
            f"The prompt needs {total} tokens but its limit is {limit}, even after degrading ({tried}). "
            f"Sections (tokens): {sizes}. Shorten the message, the workflow data or the tools, "
            f"or give the agent a larger context window."
        )


@dataclass(frozen=True)
class ContextBudget:
    """How many tokens a prompt may use, and each section's share of them."""

    window: int
    response_reserve: int
    safety_margin: float
    shares: Mapping[str, float]
    window_turns: int
    min_turns: int = MIN_TURNS
    memory_budget_tokens: int = 2000
    # The largest reply, in tokens (the agent's ``max_tokens``, or ``default_reply_tokens`` of the window).
    reply_tokens: int = 1024

    def __post_init__(self) -> None:
        if not 0 <= self.safety_margin < 1:
            raise ValueError(f"safety_margin must be in [0, 1), got {self.safety_margin}")
        if self.prompt_limit <= 0:
            raise ValueError(
                f"No room for a prompt: window {self.window} − reserve {self.response_reserve} "
                f"− margin {math.ceil(self.window * self.safety_margin)} ≤ 0"
            )

    @classmethod
    def from_agent(cls, agent: Agent) -> ContextBudget:
        """The agent's budget. The reserve is at least ``max_tokens``: a reply must never be cut for lack of room.
        The window is the agent's, capped by its endpoint's when one is configured (``LLM_CONTEXT_WINDOW``, or
        a profile's ``context_window``): an agent set up bigger than its model cannot overflow it."""
        shares = dict(DEFAULT_SHARES)
        budgets = agent.section_budgets if isinstance(agent.section_budgets, dict) else {}  # validated by Agent.clean
        for name, share in budgets.items():
            if name in DEFAULT_SHARES and isinstance(share, int | float) and share >= 0:
                shares[name] = float(share)
        ceiling = endpoint_window(agent)
        window = min(agent.context_window, ceiling) if ceiling else agent.context_window
        reply_tokens = agent.max_tokens or default_reply_tokens(window)
        reserve = max(agent.response_reserve, reply_tokens)
        if (
            ceiling
            and window < agent.context_window
            and window - reserve - math.ceil(window * agent.safety_margin) <= 0
        ):
            raise LLMConfigurationError(
                f"the endpoint's context window ({ceiling} tokens, LLM_CONTEXT_WINDOW or the profile's "
                f"context_window) leaves no room for a prompt after agent {agent.slug!r}'s reply reserve of "
                f"{reserve} tokens and its safety margin"
            )
        return cls(
            window=window,
            response_reserve=reserve,
            safety_margin=agent.safety_margin,
            shares=shares,
            window_turns=max(agent.window_turns, MIN_TURNS),
            min_turns=MIN_TURNS,
            memory_budget_tokens=agent.memory_budget_tokens,
            reply_tokens=reply_tokens,
        )

    @property
    def prompt_limit(self) -> int:
        return self.window - self.response_reserve - math.ceil(self.window * self.safety_margin)

    def section_limit(self, name: str) -> int:
        """Tokens section ``name`` may use; memories are also held to ``memory_budget_tokens``."""
        if name not in SECTIONS:
            raise ValueError(f"unknown section {name!r}; sections are {', '.join(SECTIONS)}")
        limit = math.floor(self.prompt_limit * self.shares.get(name, DEFAULT_SHARES[name]))
        if name == "memories":
            limit = min(limit, self.memory_budget_tokens)
        return limit


def cut_to_budget(text: str, budget: int, counter: TokenCounter) -> tuple[str, int]:
    """``text`` if it fits ``budget`` tokens, else its head and tail around a cut marker; and the tokens cut.

    The result never exceeds ``budget`` tokens.
    """
    tokens = counter.count(text)
    if tokens <= budget:
        return text, 0
    marker_probe = CUT_MARKER.format(cut=tokens, budget=budget)
    room = budget - counter.count(marker_probe) - 2
    if room <= 0:
        return counter.truncate(marker_probe, max(budget, 0)), tokens
    encoding = counter._encoding  # the counter's own encoding, so cuts agree with counts
    ids = encoding.encode(text, disallowed_special=())
    while room > 0:
        # Keep more of the head (the question, the document's start) and some tail (errors, totals).
        head_n = math.ceil(room * 2 / 3)
        tail_n = room - head_n
        head = encoding.decode(ids[:head_n])
        tail = encoding.decode(ids[len(ids) - tail_n :]) if tail_n else ""
        cut = len(ids) - head_n - tail_n
        result = f"{head}\n{CUT_MARKER.format(cut=cut, budget=budget)}\n{tail}".rstrip("\n")
        if counter.count(result) <= budget:
            return result, cut
        room -= max(1, counter.count(result) - budget)
    return counter.truncate(marker_probe, budget), tokens


def turn_tokens(turn: TurnText, *, budget: ContextBudget, counter: TokenCounter) -> int:
    """Tokens a past turn takes in the prompt (each side held to the message budget, as the builder cuts it)."""
    cap = budget.section_limit("message")
    tokens = TOKENS_PER_MESSAGE + min(counter.count(turn.user), cap)
    if turn.assistant:
        tokens += TOKENS_PER_MESSAGE + min(counter.count(turn.assistant), cap)
    return tokens


def window_size(turns: Sequence[TurnText], *, budget: ContextBudget, counter: TokenCounter) -> int:
    """How many of the newest ``turns`` the sliding window holds.

    At most ``window_turns`` turns and, beyond ``min_turns``, no more than fit in the recent
    section's token budget: long turns make the window shorter, so the prompt stays the same size.
    The summary trigger uses the same rule, so the turns it folds in are the ones that leave.
    """
    limit = budget.section_limit("recent")
    used = 0
    count = 0
    for turn in reversed(turns):
        if count >= budget.window_turns:
            break
        used += turn_tokens(turn, budget=budget, counter=counter)
        if used > limit and count >= budget.min_turns:
            break
        count += 1
    return count
