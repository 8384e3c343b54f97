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

Its modules, in the order of a build:
- ``inputs``: what a prompt is made of (``PromptInputs``, ``MemoryItem``, ``TurnText``);
- ``budget``: ``ContextBudget``, ``ContextOverflowError``, the sliding window, ``cut_to_budget``;
- ``state``: one build's ``Draft`` and ``BuildLog``;
- ``allocation``: steps 1 and 2, inputs cut to their budgets and sections filled;
- ``degradation``: step 3, the degradations in their fixed order;
- ``rendering``: the messages under their headers, and each section's tokens;
- ``builder``: ``build_prompt``, the steps in order, and ``BuiltPrompt`` with its composition.
"""

from llm.prompt.allocation import MIN_TOOL_RESULT_TOKENS
from llm.prompt.budget import (
    CUT_MARKER,
    MIN_TURNS,
    SECTIONS,
    ContextBudget,
    ContextOverflowError,
    cut_to_budget,
    turn_tokens,
    window_size,
)
from llm.prompt.builder import BuiltPrompt, build_prompt
from llm.prompt.degradation import (
    SIMPLIFIED_SYSTEM_TOKENS,
    SUMMARY_SHORTENED_MARKER,
    SYSTEM_FLOOR_TOKENS,
    SYSTEM_SIMPLIFIED_MARKER,
)
from llm.prompt.inputs import MemoryItem, PromptInputs, TurnText
from llm.prompt.rendering import HEADER_MEMORIES, HEADER_PROCEDURES, HEADER_SUMMARY, HEADER_WORKFLOW
from llm.sections import DEFAULT_SHARES

__all__ = [
    # inputs
    "MemoryItem",
    "PromptInputs",
    "TurnText",
    # budget
    "SECTIONS",
    "DEFAULT_SHARES",
    "MIN_TURNS",
    "CUT_MARKER",
    "ContextBudget",
    "ContextOverflowError",
    "cut_to_budget",
    "turn_tokens",
    "window_size",
    # allocation and degradation
    "MIN_TOOL_RESULT_TOKENS",
    "SIMPLIFIED_SYSTEM_TOKENS",
    "SYSTEM_FLOOR_TOKENS",
    "SUMMARY_SHORTENED_MARKER",
    "SYSTEM_SIMPLIFIED_MARKER",
    # rendering
    "HEADER_WORKFLOW",
    "HEADER_PROCEDURES",
    "HEADER_MEMORIES",
    "HEADER_SUMMARY",
    # builder
    "BuiltPrompt",
    "build_prompt",
]
