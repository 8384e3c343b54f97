"""Steps 1 and 2 of a build: inputs larger than their own budget are cut, visibly (the message, the summary, past
turns, each tool result); then procedures and memories are taken up to their section budgets, and turns by the
window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm.prompt.budget import ContextBudget, window_size
from llm.prompt.inputs import PromptInputs, TurnText
from llm.prompt.state import BuildLog, Draft
from llm.tokens import TokenCounter

# Each tool result gets at least this many tokens, however many results share the tools budget.
MIN_TOOL_RESULT_TOKENS = 128


@dataclass
class CutInputs:
    """The inputs once each is within its own budget."""

    message_msg: dict[str, Any]
    tool_messages: list[dict[str, Any]]
    summary: str
    turn_messages: dict[int, list[dict[str, Any]]]


def cut_inputs(inputs: PromptInputs, budget: ContextBudget, counter: TokenCounter, log: BuildLog) -> CutInputs:
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
    return CutInputs(message_msg, tool_messages, summary, turn_messages)


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


def _turns_in_view(inputs: PromptInputs, budget: ContextBudget, counter: TokenCounter, log: BuildLog) -> list[TurnText]:
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


def _fill(texts: Sequence[str], limit: int, counter: TokenCounter) -> int:
    """How many leading items fit in ``limit`` tokens (as bullet lines)."""
    used = 0
    for index, text in enumerate(texts):
        used += counter.count(f"- {text.strip()}\n")
        if used > limit:
            return index
    return len(texts)


def allocate(
    inputs: PromptInputs, budget: ContextBudget, counter: TokenCounter, cut: CutInputs, log: BuildLog
) -> Draft:
    """Step 2: procedures and memories up to their section budgets; turns by the window."""
    n_proc = _fill(inputs.procedural, budget.section_limit("procedural"), counter)
    log.procedural_dropped.extend(
        {"index": i, "reason": "over the procedures budget"} for i in range(n_proc, len(inputs.procedural))
    )
    n_mem = _fill([m.text for m in inputs.memories], budget.section_limit("memories"), counter)
    log.memories_dropped.extend({"id": m.id, "reason": "over the memory budget"} for m in inputs.memories[n_mem:])
    return Draft(
        system_prompt=inputs.system_prompt,
        procedural=list(inputs.procedural[:n_proc]),
        memories=list(inputs.memories[:n_mem]),
        summary=cut.summary,
        turns=_turns_in_view(inputs, budget, counter, log),
        turn_messages=cut.turn_messages,
    )
