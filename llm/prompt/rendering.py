"""The prompt's messages: the system message made of its sections under their headers, the turns kept, the new
message and this turn's tool messages; and each section's tokens, which add up to the prompt's total.
"""

from __future__ import annotations

from typing import Any

from llm.prompt.budget import SECTIONS
from llm.prompt.inputs import PromptInputs
from llm.prompt.state import Draft
from llm.tokens import REPLY_PRIMING, TokenCounter

HEADER_WORKFLOW = "## Current workflow step"
HEADER_PROCEDURES = "## Procedures"
HEADER_MEMORIES = "## What you remember about the user"
HEADER_SUMMARY = "## Earlier in this conversation (summary)"


def _system_parts(draft: Draft, inputs: PromptInputs) -> list[tuple[str, str]]:
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


def assemble(
    draft: Draft,
    inputs: PromptInputs,
    message_msg: dict[str, Any],
    tool_messages: list[dict[str, Any]],
    counter: TokenCounter,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The prompt's messages as the draft stands, and each section's tokens (they add up to the total)."""
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
