"""Continuing a prose reply that the token limit cut off.

A reply that stops with finish reason ``length`` is not thrown away: the partial text goes back to the
model as its own (assistant) message, followed by an instruction to go on from where it stopped, and what
comes back is appended. The turn does this a few times at most (``MAX_CONTINUATIONS``) and only while the
grown prompt still fits the window; a reply that is still cut after that is kept and marked as cut off.
Structured outputs are never continued: a cut-off object is invalid (repair or fail).
"""

from __future__ import annotations

from agents.llm.base import Message

MAX_CONTINUATIONS = 3

CONTINUE_INSTRUCTION = (
    "Your previous reply was cut off by the length limit. Continue exactly where it stopped: do not repeat "
    "anything, do not add a preamble, and keep the same language and format."
)


def default_reply_tokens(window: int) -> int:
    """The reply budget of an agent that sets none: an eighth of the window, at least 1,024 tokens, and never
    more than half of the window (the prompt needs the rest)."""
    return max(1, min(max(1024, window // 8), window // 2))


def continuation_messages(messages: list[Message], partial: str) -> list[Message]:
    """The request that asks for the rest of ``partial``: the original messages, the partial as the
    assistant's, and the instruction to continue."""
    return [*messages, {"role": "assistant", "content": partial}, {"role": "user", "content": CONTINUE_INSTRUCTION}]


def continued_partial(messages: list[Message]) -> str | None:
    """The partial reply being continued, when ``messages`` is a continuation request; ``None`` otherwise."""
    if len(messages) < 2:
        return None
    last, before = messages[-1], messages[-2]
    if last.get("role") == "user" and last.get("content") == CONTINUE_INSTRUCTION and before.get("role") == "assistant":
        content = before.get("content")
        return content if isinstance(content, str) else None
    return None
