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
    """A deterministic reply that says what it is, then quotes what it remembers about the user and what was said
    earlier in the chat, the most related to the user's words first: never its own instructions (the agent's
    prompt, a workflow's lines), never the same sentence twice."""
    user_text = next((text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")
    last = messages[-1] if messages else {}
    lines = [f"{DEMO_REPLY_PREFIX} I am the offline demo model: I quote what I was given instead of thinking."]
    if last.get("role") == "tool":
        lines.append(f"The tool answered: {clip_words(text_of(last), 60)}")
        return " ".join(lines)
    query = keywords(user_text)
    scored: dict[str, tuple[int, int, str, str]] = {}
    for position, (intro, sentence) in enumerate(_quotable(messages, last)):
        overlap = len(query & keywords(sentence))
        key = " ".join(sorted(keywords(sentence))) or sentence.lower()
        if overlap and key not in scored:
            scored[key] = (overlap, -position, intro, sentence)
    best = sorted(scored.values(), reverse=True)[:2]
    if user_text:
        lines.append(f"You said: \u201c{clip_words(user_text, 40)}\u201d.")
    if best:
        # Quoted in their original order so the reply reads naturally, each source named once.
        quoted, said = [], ""
        for _, _, intro, sentence in sorted(best, key=lambda item: -item[1]):
            quoted.append(
                f"{intro} {clip_words(sentence, 40)}" if intro and intro != said else clip_words(sentence, 40)
            )
            said = intro or said
        lines.append("Related to that: " + " ".join(quoted))
    else:
        lines.append("Nothing I remember or that was said here matches that.")
    lines.append("Set LLM_BASE_URL and LLM_MODEL to talk to a real model.")
    return " ".join(lines)


# A sentence of the agent's prompt addressed to the model: an instruction, not something to quote to the user.
_TO_THE_MODEL = re.compile(
    r"^(?:you\b|your\b|be\b|always\b|never\b|do not\b|don'?t\b|answer\b|reply\b|respond\b|keep\b|use\b|act\b|"
    r"help\b|please\b|avoid\b|ask\b|make sure\b|if the user\b|when the user\b)",
    re.IGNORECASE,
)

# The prompt's sections the demo may quote (``llm.prompt.rendering``'s headers; that package imports this one,
# through ``llm.providers``): what is remembered about the user, and the summary of the chat.
_QUOTABLE_HEADERS = {
    "## What you remember about the user": "I remember:",
    "## Earlier in this conversation (summary)": "Earlier:",
}


# Instructions to the model: a workflow's step (its machine lines), the procedures it follows.
_NOT_QUOTED_HEADERS = {"## Current workflow step", "## Procedures"}


def _quotable(messages: list[Message], last: Message) -> list[tuple[str, str]]:
    """(how it is introduced, sentence) for each sentence the demo may quote: the remembered facts and the summary
    from the system prompt, and the earlier messages of the chat (the user's and its own)."""
    found: list[tuple[str, str]] = []
    for message in messages:
        if message is last:
            continue
        role = message.get("role")
        if role == "system":
            # The agent's own prompt (before the app's sections, and its own headers): its statements (a shop's
            # hours) may be quoted, not its instructions to the model ("You are a helpful assistant", "Be brief").
            section: str | None = ""
            for line in text_of(message).splitlines():
                if line.startswith("## "):
                    header = line.strip()
                    section = None if header in _NOT_QUOTED_HEADERS else _QUOTABLE_HEADERS.get(header, "")
                    continue
                if section is None or not line.strip():
                    continue
                sentences = split_sentences(line.strip().removeprefix("- "))
                if section == "":
                    sentences = [s for s in sentences if not _TO_THE_MODEL.match(s) and not _MACHINE_LINE.match(s)]
                found += [(section, s) for s in sentences]
        elif role in ("user", "assistant"):
            intro = "Earlier you said:" if role == "user" else ""
            text = text_of(message)
            if role == "assistant" and text.startswith(DEMO_REPLY_PREFIX):
                continue  # its own quoting, quoted again, was how it came to repeat itself
            found += [(intro, s) for s in split_sentences(text) if not _MACHINE_LINE.match(s)]
    return found
