"""The demo model's replies: the hand-off when the user asks for a person, else the registered handlers' answer,
else the default reply, which quotes what it was given (never a prompt's machine lines) and says what it is.
"""

from __future__ import annotations

import json
import logging
import re

from llm.base import HANDOFF_TOOL, Message, ToolCallRequest, ToolSpec
from llm.demo.reading import asks_for_person, clip_words, keywords, split_sentences, text_of
from llm.demo.registry import DEMO_REPLY_PREFIX, DemoReply, reply_handlers

logger = logging.getLogger(__name__)


def demo_reply(messages: list[Message], tools: list[ToolSpec] | None) -> DemoReply:
    """The registered handlers' answer, else the default extractive reply."""
    if tools and any(t.name == HANDOFF_TOOL.name for t in tools):
        user = next((text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")
        if asks_for_person(user) and not any(m.get("role") == "tool" for m in messages):
            arguments = json.dumps({"reason": "the user asked for a person"})
            return DemoReply(
                text="", tool_calls=[ToolCallRequest(id="call_person", name=HANDOFF_TOOL.name, arguments=arguments)]
            )
    for handler in reply_handlers():
        try:
            reply = handler(messages, tools)
        except Exception:
            # A broken handler must not take the demo down; the next handler or the default answers.
            logger.exception("demo reply handler %r failed", handler)
            continue
        if reply is not None:
            return reply
    return DemoReply(text=default_reply(messages))


# A prompt's machine-readable lines and headers: "WORKFLOW: returns (…)", "COLLECTED: {…}", "## Current workflow step",
# and the workflow section's instructions to the model ("Next question: …", "Already collected: …").
_MACHINE_LINE = re.compile(
    r"^(?:[A-Z][A-Z_]{2,}:|#+\s|(?:Next question|Already collected|Still needed|Current step|Slots):|"
    r"The user went back to change|NOT ACCEPTED)"
)


def default_reply(messages: list[Message]) -> str:
    """A deterministic reply that says what it is, then quotes the context most related to the user's words."""
    user_text = next((text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")
    last = messages[-1] if messages else {}
    lines = [f"{DEMO_REPLY_PREFIX} I am the offline demo model: I quote what I was given instead of thinking."]
    if last.get("role") == "tool":
        lines.append(f"The tool answered: {clip_words(text_of(last), 60)}")
        return " ".join(lines)
    query = keywords(user_text)
    context = [m for m in messages if m is not last and m.get("role") in ("system", "assistant", "tool", "user")]
    scored: list[tuple[int, int, str]] = []
    position = 0
    for message in context:
        text = text_of(message)
        if message.get("role") == "system":
            text = _without_workflow_section(text)
        for sentence in split_sentences(text):
            if _MACHINE_LINE.match(sentence):
                continue  # the prompt's own lines (a workflow's state, its data): not for the user to read
            position += 1
            overlap = len(query & keywords(sentence))
            if overlap:
                scored.append((overlap, -position, sentence))
    best = sorted(scored, reverse=True)[:2]
    if user_text:
        lines.append(f"You said: \u201c{clip_words(user_text, 40)}\u201d.")
    if best:
        # Quote in their original order so the reply reads naturally.
        quoted = [s for _, _, s in sorted(best, key=lambda item: -item[1])]
        lines.append("Related to that, I was told: " + " ".join(clip_words(s, 40) for s in quoted))
    else:
        lines.append("I found nothing related in what I was given.")
    lines.append("Set LLM_BASE_URL and LLM_MODEL to talk to a real model.")
    return " ".join(lines)


# The header of the prompt's workflow section (``llm.prompt.HEADER_WORKFLOW``; that package imports this one,
# through ``llm.providers``).
_WORKFLOW_HEADER = "## Current workflow step"


def _without_workflow_section(text: str) -> str:
    """A system prompt without its workflow section: instructions to the model, never quoted to the user."""
    kept: list[str] = []
    skipping = False
    for line in text.splitlines():
        if line.startswith("## "):
            skipping = line.strip() == _WORKFLOW_HEADER
        if not skipping:
            kept.append(line)
    return "\n".join(kept)
