"""``build_prompt``: the steps of a build in order (cut, allocate, assemble, degrade until it fits), and what it
gives back: the ``BuiltPrompt`` and its composition (the context inspector).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm.prompt.allocation import allocate, cut_inputs
from llm.prompt.budget import SECTIONS, ContextBudget, ContextOverflowError
from llm.prompt.degradation import degrade
from llm.prompt.inputs import PromptInputs
from llm.prompt.rendering import assemble
from llm.prompt.state import BuildLog, Draft
from llm.tokens import TokenCounter


@dataclass
class BuiltPrompt:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    sections: dict[str, int]
    total_tokens: int
    limit: int
    composition: dict[str, Any]
    degradations: list[str]


def _composition(
    *, inputs: PromptInputs, budget: ContextBudget, draft: Draft, sections: dict[str, int], total: int, log: BuildLog
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
    log = BuildLog(counter=counter)
    cut = cut_inputs(inputs, budget, counter, log)
    draft = allocate(inputs, budget, counter, cut, log)
    # Pre-flight check with real counts; degrade in the fixed order until it fits.
    while True:
        messages, sections = assemble(draft, inputs, cut.message_msg, cut.tool_messages, counter)
        total = sum(sections.values())
        if total <= limit:
            break
        if not degrade(draft, total - limit, budget, counter, log):
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
