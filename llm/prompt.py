"""Prompt building: a token budget per agent, budgeted sections, a sliding window, degradation.

Every prompt is assembled from sections, each with a share of the prompt budget (the model's
window minus the response reserve and a safety margin), and counted with the model's real
tokenizer before it is sent. Over budget, the builder degrades in a fixed order:

1. ``shrink_window``: drop the oldest recent turns, down to ``min_turns`` (3);
2. ``drop_memories``: drop the lowest-ranked memories;
3. ``shorten_summary``: cut the conversation summary (with a visible marker), or drop it when even the
   shortened one does not fit (``composition["summary"]["dropped"]``);
4. ``simplify_system``: drop the procedures and keep only the first paragraph of the system prompt.

If the prompt still does not fit, ``ContextOverflowError`` is raised: an over-long prompt is never
sent and nothing is truncated silently. The workflow step (resume instruction and collected data),
the fixed instructions, the new message and this turn's tool messages are never dropped.

An input larger than its own budget (a pasted document, a huge tool result, an old turn that was
one) is cut in the middle, keeping its head and tail, with a marker saying how much was cut::

    [… 12,345 tokens cut: the input exceeded its 2,000-token budget …]

``BuiltPrompt.composition`` records how the prompt was made (the context inspector). Pure: no ORM; the
session's turns come in as ``TurnText`` (``sessions.context.turn_history`` reads them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llm.base import LLMConfigurationError
from llm.continuation import default_reply_tokens
from llm.providers import endpoint_window
from llm.sections import DEFAULT_SHARES
from llm.tokens import REPLY_PRIMING, TOKENS_PER_MESSAGE, TokenCounter

if TYPE_CHECKING:
    # Any object with an agent's budget fields (``agents.models.Agent``); the library has no ORM.
    Agent = Any

SECTIONS: tuple[str, ...] = ("system", "workflow", "procedural", "memories", "summary", "recent", "message", "tools")
MIN_TURNS = 3
# A simplified system prompt keeps its first paragraph, at most this long; below the floor it is not cut further.
SIMPLIFIED_SYSTEM_TOKENS = 200
SYSTEM_FLOOR_TOKENS = 32
# Each tool result gets at least this many tokens, however many results share the tools budget.
MIN_TOOL_RESULT_TOKENS = 128

CUT_MARKER = "[… {cut:,} tokens cut: the input exceeded its {budget:,}-token budget …]"
SUMMARY_SHORTENED_MARKER = "[… summary shortened by {cut:,} tokens to fit the prompt budget …]"
SYSTEM_SIMPLIFIED_MARKER = "[… system prompt simplified to fit the prompt budget …]"

HEADER_WORKFLOW = "## Current workflow step"
HEADER_PROCEDURES = "## Procedures"
HEADER_MEMORIES = "## What you remember about the user"
HEADER_SUMMARY = "## Earlier in this conversation (summary)"


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


@dataclass
class BuiltPrompt:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    sections: dict[str, int]
    total_tokens: int
    limit: int
    composition: dict[str, Any]
    degradations: list[str]


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


def _first_paragraph(text: str) -> str:
    for part in text.strip().split("\n\n"):
        if part.strip():
            return part.strip()
    return ""


@dataclass
class _Draft:
    """The mutable state of one build: what is kept so far."""

    system_prompt: str
    procedural: list[str]
    memories: list[MemoryItem]
    summary: str
    turns: list[TurnText]
    turn_messages: dict[int, list[dict[str, Any]]]


def _system_parts(draft: _Draft, inputs: PromptInputs) -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = []
    if draft.system_prompt.strip():
        parts.append(("system", draft.system_prompt.strip()))
    if inputs.fixed_instructions.strip():
        parts.append(("system", inputs.fixed_instructions.strip()))
    if inputs.workflow_text.strip():
        parts.append(("workflow", f"{HEADER_WORKFLOW}\n{inputs.workflow_text.strip()}"))
    if draft.procedural:
        parts.append(("procedural", HEADER_PROCEDURES + "\n" + "\n".join(f"- {p.strip()}" for p in draft.procedural)))
    if draft.memories:
        parts.append(("memories", HEADER_MEMORIES + "\n" + "\n".join(f"- {m.text.strip()}" for m in draft.memories)))
    if draft.summary.strip():
        parts.append(("summary", f"{HEADER_SUMMARY}\n{draft.summary.strip()}"))
    return parts


def _assemble(
    draft: _Draft,
    inputs: PromptInputs,
    message_msg: dict[str, Any],
    tool_messages: list[dict[str, Any]],
    counter: TokenCounter,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    parts = _system_parts(draft, inputs)
    system_msg = {"role": "system", "content": "\n\n".join(text for _, text in parts)}
    messages: list[dict[str, Any]] = [system_msg]
    for turn in draft.turns:
        messages.extend(draft.turn_messages[turn.seq])
    messages.append(message_msg)
    messages.extend(tool_messages)

    sections = dict.fromkeys(SECTIONS, 0)
    for name, text in parts:
        if name != "system":
            sections[name] += counter.count(text)
    # The system section takes what is left of the system message: the agent's prompt, the fixed
    # instructions, separators, message overhead and reply priming. So the sections add up to the total.
    sections["system"] = counter.count_message(system_msg) + REPLY_PRIMING - sum(sections.values())
    sections["recent"] = sum(counter.count_message(m) for t in draft.turns for m in draft.turn_messages[t.seq])
    sections["message"] = counter.count_message(message_msg)
    sections["tools"] = counter.count_tools(inputs.tools) + sum(counter.count_message(m) for m in tool_messages)
    return messages, sections


def _fill(texts: Sequence[str], limit: int, counter: TokenCounter) -> int:
    """How many leading items fit in ``limit`` tokens (as bullet lines)."""
    used = 0
    for index, text in enumerate(texts):
        used += counter.count(f"- {text.strip()}\n")
        if used > limit:
            return index
    return len(texts)


@dataclass
class _Log:
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


@dataclass
class _CutInputs:
    """The inputs once each is within its own budget."""

    message_msg: dict[str, Any]
    tool_messages: list[dict[str, Any]]
    summary: str
    turn_messages: dict[int, list[dict[str, Any]]]


def _cut_inputs(inputs: PromptInputs, budget: ContextBudget, counter: TokenCounter, log: _Log) -> _CutInputs:
    """Step 1: inputs larger than their own budget are cut, visibly."""
    message_limit = budget.section_limit("message")
    message_msg = {"role": "user", "content": log.cut(inputs.message, message_limit, "message")}
    tool_messages = _cut_tool_results(inputs, budget, counter, log.cut)
    summary = log.cut(inputs.summary, budget.section_limit("summary"), "summary") if inputs.summary else ""
    turn_messages: dict[int, list[dict[str, Any]]] = {}
    for turn in inputs.recent_turns:
        msgs = [{"role": "user", "content": log.cut(turn.user, message_limit, f"turn {turn.seq} user")}]
        if turn.assistant:
            msgs.append(
                {"role": "assistant", "content": log.cut(turn.assistant, message_limit, f"turn {turn.seq} assistant")}
            )
        turn_messages[turn.seq] = msgs
    return _CutInputs(message_msg, tool_messages, summary, turn_messages)


def _turns_in_view(inputs: PromptInputs, budget: ContextBudget, counter: TokenCounter, log: _Log) -> list[TurnText]:
    """The window's turns, after the older ones not yet in the summary (kept: better than losing them)."""
    turns = inputs.recent_turns
    n_window = window_size(turns, budget=budget, counter=counter)
    window = list(turns[len(turns) - n_window :])
    stretched: list[TurnText] = []
    for turn in turns[: len(turns) - len(window)]:
        if inputs.summary_through_seq is not None and turn.seq > inputs.summary_through_seq:
            # Not in the summary yet: keeping it beats losing it; degradation removes it if room runs out.
            stretched.append(turn)
            log.kept_unsummarized.append(turn.seq)
        else:
            log.turns_dropped.append({"seq": turn.seq, "reason": "left the window"})
    return stretched + window


def _allocate(inputs: PromptInputs, budget: ContextBudget, counter: TokenCounter, cut: _CutInputs, log: _Log) -> _Draft:
    """Step 2: procedures and memories up to their section budgets; turns by the window."""
    n_proc = _fill(inputs.procedural, budget.section_limit("procedural"), counter)
    log.procedural_dropped.extend(
        {"index": i, "reason": "over the procedures budget"} for i in range(n_proc, len(inputs.procedural))
    )
    n_mem = _fill([m.text for m in inputs.memories], budget.section_limit("memories"), counter)
    log.memories_dropped.extend({"id": m.id, "reason": "over the memory budget"} for m in inputs.memories[n_mem:])
    return _Draft(
        system_prompt=inputs.system_prompt,
        procedural=list(inputs.procedural[:n_proc]),
        memories=list(inputs.memories[:n_mem]),
        summary=cut.summary,
        turns=_turns_in_view(inputs, budget, counter, log),
        turn_messages=cut.turn_messages,
    )


def _shrink_window(draft: _Draft, over: int, budget: ContextBudget, counter: TokenCounter, log: _Log) -> None:
    # Whole messages are counted independently, so dropping turns lowers the total exactly.
    unsummarized = set(log.kept_unsummarized)
    while over > 0 and len(draft.turns) > budget.min_turns:
        oldest = draft.turns.pop(0)
        over -= sum(counter.count_message(m) for m in draft.turn_messages[oldest.seq])
        reason = "degraded: window shrunk"
        if oldest.seq in unsummarized:
            reason += " (not yet in the summary)"
        log.turns_dropped.append({"seq": oldest.seq, "reason": reason})
    log.note("shrink_window")


def _drop_memories(draft: _Draft, over: int, counter: TokenCounter, log: _Log) -> None:
    while over > 0 and draft.memories:
        worst = draft.memories.pop()
        over -= counter.count(f"- {worst.text.strip()}\n")
        log.memories_dropped.append({"id": worst.id, "reason": "degraded: lowest-ranked dropped to fit"})
    log.note("drop_memories")


def _simplify_system(draft: _Draft, counter: TokenCounter, log: _Log) -> bool:
    """Drop the procedures and keep the system prompt's first paragraph; False when it is already that."""
    if not draft.procedural and draft.system_prompt.strip() == _first_paragraph(draft.system_prompt):
        return False
    log.procedural_dropped.extend(
        {"index": i, "reason": "degraded: system prompt simplified"} for i in range(len(draft.procedural))
    )
    draft.procedural = []
    first = counter.truncate(_first_paragraph(draft.system_prompt), SIMPLIFIED_SYSTEM_TOKENS)
    draft.system_prompt = f"{first}\n{SYSTEM_SIMPLIFIED_MARKER}"
    return True


def _cut_system_to_floor(draft: _Draft, over: int, counter: TokenCounter) -> bool:
    """Cut the simplified system prompt further, not below ``SYSTEM_FLOOR_TOKENS``; False when at the floor."""
    system_tokens = counter.count(draft.system_prompt)
    if system_tokens <= SYSTEM_FLOOR_TOKENS:
        return False
    keep = max(SYSTEM_FLOOR_TOKENS, system_tokens - over - 16)
    body = _first_paragraph(draft.system_prompt.replace(SYSTEM_SIMPLIFIED_MARKER, ""))
    draft.system_prompt = f"{counter.truncate(body, keep)}\n{SYSTEM_SIMPLIFIED_MARKER}"
    return True


def _degrade(draft: _Draft, over: int, budget: ContextBudget, counter: TokenCounter, log: _Log) -> bool:
    """Step 3: one degradation, the next in the fixed order; False when none is left."""
    if len(draft.turns) > budget.min_turns:
        _shrink_window(draft, over, budget, counter, log)
    elif draft.memories:
        _drop_memories(draft, over, counter, log)
    elif draft.summary and not log.summary_shortened:
        draft.summary = _shorten_summary(draft.summary, over, counter)
        log.summary_shortened = True
        log.note("shorten_summary")
    elif draft.summary:
        draft.summary = ""  # the shortened summary still did not fit: drop it before touching the system prompt
    elif log.simplified == 0 and _simplify_system(draft, counter, log):
        log.simplified = 1
        log.note("simplify_system")
    elif log.simplified < 2 and _cut_system_to_floor(draft, over, counter):
        log.simplified = 2
        log.note("simplify_system")
    else:
        return False
    return True


def _composition(
    *, inputs: PromptInputs, budget: ContextBudget, draft: _Draft, sections: dict[str, int], total: int, log: _Log
) -> dict[str, Any]:
    """How the prompt was made (the context inspector)."""
    included = {t.seq for t in draft.turns}
    return {
        "limit": budget.prompt_limit,
        "total": total,
        "window": budget.window,
        "response_reserve": budget.response_reserve,
        "safety_margin": budget.safety_margin,
        "sections": sections,
        "section_limits": {name: budget.section_limit(name) for name in SECTIONS},
        "turns": {
            "included": [t.seq for t in draft.turns],
            "dropped": sorted(log.turns_dropped, key=lambda d: d["seq"]),
            "kept_unsummarized": [s for s in log.kept_unsummarized if s in included],
            "window_turns": budget.window_turns,
        },
        "memories": {"included": [m.id for m in draft.memories], "dropped": log.memories_dropped},
        "procedural": {"included": len(draft.procedural), "dropped": log.procedural_dropped},
        "summary": {
            "through_seq": inputs.summary_through_seq,
            "tokens": sections["summary"],
            "shortened": "shorten_summary" in log.degradations,
            "dropped": bool(inputs.summary) and not draft.summary,
        },
        "degradations": log.degradations,
        "cut_inputs": log.cut_inputs,
    }


def build_prompt(*, inputs: PromptInputs, budget: ContextBudget, counter: TokenCounter) -> BuiltPrompt:
    """Assemble the prompt from budgeted sections, degrading in a fixed order until it fits.

    Raises ``ContextOverflowError`` when even the degraded prompt exceeds ``budget.prompt_limit``.
    """
    limit = budget.prompt_limit
    log = _Log(counter=counter)
    cut = _cut_inputs(inputs, budget, counter, log)
    draft = _allocate(inputs, budget, counter, cut, log)
    # Pre-flight check with real counts; degrade in the fixed order until it fits.
    while True:
        messages, sections = _assemble(draft, inputs, cut.message_msg, cut.tool_messages, counter)
        total = sum(sections.values())
        if total <= limit:
            break
        if not _degrade(draft, total - limit, budget, counter, log):
            raise ContextOverflowError(total=total, limit=limit, sections=sections, degradations=log.degradations)
    return BuiltPrompt(
        messages=messages,
        tools=list(inputs.tools),
        sections=sections,
        total_tokens=total,
        limit=limit,
        composition=_composition(inputs=inputs, budget=budget, draft=draft, sections=sections, total=total, log=log),
        degradations=log.degradations,
    )


def _shorten_summary(summary: str, over: int, counter: TokenCounter) -> str:
    tokens = counter.count(summary)
    marker_tokens = counter.count(SUMMARY_SHORTENED_MARKER.format(cut=tokens)) + 2
    keep = tokens - over - marker_tokens - 4
    if keep <= 16:
        return ""
    # The head is kept: summaries lead with decisions and facts (see sessions.summaries).
    head = counter.truncate(summary, keep)
    return f"{head}\n{SUMMARY_SHORTENED_MARKER.format(cut=tokens - counter.count(head))}"


def _cut_tool_results(
    inputs: PromptInputs,
    budget: ContextBudget,
    counter: TokenCounter,
    cut: Any,
) -> list[dict[str, Any]]:
    results = [m for m in inputs.tool_messages if m.get("role") == "tool"]
    if not results:
        return [dict(m) for m in inputs.tool_messages]
    others = sum(counter.count_message(m) for m in inputs.tool_messages if m.get("role") != "tool")
    room = budget.section_limit("tools") - counter.count_tools(inputs.tools) - others
    per_result = max(MIN_TOOL_RESULT_TOKENS, room // len(results))
    out: list[dict[str, Any]] = []
    for message in inputs.tool_messages:
        message = dict(message)
        if message.get("role") == "tool" and isinstance(message.get("content"), str):
            label = f"tool result {message.get('name') or message.get('tool_call_id') or ''}".strip()
            message["content"] = cut(message["content"], per_result, label)
        out.append(message)
    return out
