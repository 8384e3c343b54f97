"""Continuing a prose reply that the token limit cut off.

A reply that stops with finish reason ``length`` is not thrown away: the partial text goes back to the
model as its own (assistant) message, followed by an instruction to go on from where it stopped, and what
comes back is appended. The turn does this a few times at most (``MAX_CONTINUATIONS``) and only while the
grown prompt still fits the window; a reply that is still cut after that is kept and marked as cut off.
Structured outputs are never continued: a cut-off object is invalid (repair or fail).

A continuation must add something to count: one that comes back empty, or only says again what was said (a
real model may start its reply over, or repeat its last sentence), does not complete the reply, whatever its
finish reason; the reply is kept as it was and marked as cut off. A continuation that starts the reply over
and then goes further adds only what lies past the old text (``continuation_news``).
"""

from __future__ import annotations

from llm.base import Message

MAX_CONTINUATIONS = 3
# A continuation this long or longer that is found whole inside what was said is a repeat. A shorter one may be
# a real ending that happens to occur earlier (".", "-15."): it is kept as new.
MIN_REPEAT_CHARS = 8

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


def continuation_news(said: str, continuation: str) -> str:
    """What ``continuation`` adds to the cut-off reply ``said``: ``""`` when it adds nothing (empty, blank, or a
    repeat of what was said), the part past the old text when it starts the reply over, else all of it."""
    body = continuation.strip()
    if not body:
        return ""
    head = said.strip()
    restarted = continuation.lstrip()
    if head and restarted.startswith(head):
        rest = restarted[len(head) :]
        return rest if rest.strip() else ""
    if len(body) >= MIN_REPEAT_CHARS and body in said:
        return ""
    return continuation


def may_repeat(said: str, continuation_so_far: str) -> bool:
    """Whether a continuation that has streamed ``continuation_so_far`` may still turn out to repeat ``said``
    (so its text is held back from the user until it is known to add something)."""
    body = continuation_so_far.strip()
    if not body:
        return True
    return said.strip().startswith(continuation_so_far.lstrip()) or body in said
