"""The fact extractor: the cheap model asked for the durable facts about the user in one exchange."""

from __future__ import annotations

import logging
from typing import Any

from llm.base import CallContext, LLMError
from llm.providers import get_provider
from memory.schemas import ExtractedFacts, Fact
from sessions.models import Turn

logger = logging.getLogger(__name__)


EXTRACTION_SYSTEM_PROMPT = (
    "You extract durable facts about the USER from one exchange of a conversation: their name, where they "
    "live, their home airport, their preferences, people and things they own or care about, plans with dates. "
    "Ignore small talk, questions, and anything the assistant said that the user did not confirm. "
    "Each fact is one short sentence about the user. Give a snake_case key for attributes that have one "
    "current value (name, home_city, home_airport, employer); reuse a known key when it fits; use an empty key "
    "for facts that can coexist. confidence is 1.0 for explicit statements, lower for guesses or hedges. "
    "Return an empty list when there is nothing durable."
)


def _extraction_messages(*, user_message: str, assistant_message: str, known_keys: list[str]) -> list[dict[str, Any]]:
    keys = ", ".join(known_keys) if known_keys else "(none yet)"
    return [
        {"role": "system", "content": EXTRACTION_SYSTEM_PROMPT},
        {
            "role": "user",
            "content": (
                f"Known fact keys for this user: {keys}\n\n"
                f"USER MESSAGE:\n{user_message}\n\nASSISTANT REPLY:\n{assistant_message}\n"
            ),
        },
    ]


def extract_facts(*, turn: Turn, known_keys: list[str]) -> tuple[list[Fact], str]:
    session = turn.session
    provider = get_provider(agent=session.agent, cheap=True)
    messages = _extraction_messages(
        user_message=turn.user_message, assistant_message=turn.assistant_message, known_keys=known_keys
    )
    ctx = CallContext(purpose="extract", agent_id=session.agent_id, session_id=session.pk, turn_id=turn.id)
    try:
        extracted = provider.structured(messages, schema=ExtractedFacts, ctx=ctx, max_tokens=600)
    except LLMError as exc:
        # The episode is still written; losing this turn's facts beats retrying the whole write forever.
        logger.warning("fact extraction failed for turn %s: %s", turn.id, exc)
        return [], f"{type(exc).__name__}: {exc}"
    facts = [f for f in extracted.facts if f.text.strip()]
    return facts, ""
