"""Step 3 of a build: over budget, one degradation at a time in a fixed order (shrink the window, drop memories,
shorten then drop the summary, simplify the system prompt) until the prompt fits or none is left.
"""

from __future__ import annotations

from llm.prompt.budget import ContextBudget
from llm.prompt.state import BuildLog, Draft
from llm.tokens import TokenCounter

# A simplified system prompt keeps its first paragraph, at most this long; below the floor it is not cut further.
SIMPLIFIED_SYSTEM_TOKENS = 200
SYSTEM_FLOOR_TOKENS = 32

SUMMARY_SHORTENED_MARKER = "[… summary shortened by {cut:,} tokens to fit the prompt budget …]"
SYSTEM_SIMPLIFIED_MARKER = "[… system prompt simplified to fit the prompt budget …]"


def _shrink_window(draft: Draft, over: int, budget: ContextBudget, counter: TokenCounter, log: BuildLog) -> None:
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


def _drop_memories(draft: Draft, over: int, counter: TokenCounter, log: BuildLog) -> None:
    while over > 0 and draft.memories:
        worst = draft.memories.pop()
        over -= counter.count(f"- {worst.text.strip()}\n")
        log.memories_dropped.append({"id": worst.id, "reason": "degraded: lowest-ranked dropped to fit"})
    log.note("drop_memories")


def _simplify_system(draft: Draft, counter: TokenCounter, log: BuildLog) -> bool:
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


def _cut_system_to_floor(draft: Draft, over: int, counter: TokenCounter) -> bool:
    """Cut the simplified system prompt further, not below ``SYSTEM_FLOOR_TOKENS``; False when at the floor."""
    system_tokens = counter.count(draft.system_prompt)
    if system_tokens <= SYSTEM_FLOOR_TOKENS:
        return False
    keep = max(SYSTEM_FLOOR_TOKENS, system_tokens - over - 16)
    body = _first_paragraph(draft.system_prompt.replace(SYSTEM_SIMPLIFIED_MARKER, ""))
    draft.system_prompt = f"{counter.truncate(body, keep)}\n{SYSTEM_SIMPLIFIED_MARKER}"
    return True


def degrade(draft: Draft, over: int, budget: ContextBudget, counter: TokenCounter, log: BuildLog) -> bool:
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


def _shorten_summary(summary: str, over: int, counter: TokenCounter) -> str:
    tokens = counter.count(summary)
    marker_tokens = counter.count(SUMMARY_SHORTENED_MARKER.format(cut=tokens)) + 2
    keep = tokens - over - marker_tokens - 4
    if keep <= 16:
        return ""
    # The head is kept: summaries lead with decisions and facts (see sessions.summaries).
    head = counter.truncate(summary, keep)
    return f"{head}\n{SUMMARY_SHORTENED_MARKER.format(cut=tokens - counter.count(head))}"


def _first_paragraph(text: str) -> str:
    for part in text.strip().split("\n\n"):
        if part.strip():
            return part.strip()
    return ""
