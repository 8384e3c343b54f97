"""Deterministic fact extraction for the offline demo model, so the demo shows semantic memories.

Registered with ``llm.demo.register_structured_handler`` for ``ExtractedFacts``. It reads only
the user's message (between the markers ``memory.services`` writes) and recognises a few explicit
statements. It is not an LLM and does not pretend to be one.
"""

from __future__ import annotations

import re
from typing import Any

from memory.schemas import ExtractedFacts, Fact

_USER_BLOCK = re.compile(r"USER MESSAGE:\n(?P<text>.*?)\n\nASSISTANT REPLY:", re.S)
_END = r"(?=[.,;!?\n]|\s+and\s|\s+but\s|$)"
_PATTERNS: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"(?i:\bmy name is)\s+(?P<v>[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)?)"), "name", "The user's name is {v}."),
    (
        re.compile(r"(?i:\bmy home airport is)\s+(?P<v>[A-Za-z][\w .'-]*?)" + _END),
        "home_airport",
        "The user's home airport is {v}.",
    ),
    (re.compile(r"(?i:\bI live in)\s+(?P<v>[A-Z][\w .'-]*?)" + _END), "home_city", "The user lives in {v}."),
    (re.compile(r"(?i:\bI prefer)\s+(?P<v>[\w][\w .'-]*?)" + _END), "", "The user prefers {v}."),
]


def extract_facts_demo(messages: list[dict[str, Any]]) -> ExtractedFacts | None:
    """Facts from "my name is X", "I live in X", "I prefer X", "my home airport is X"; None if not ours."""
    content = next((str(m.get("content", "")) for m in reversed(messages) if m.get("role") == "user"), "")
    block = _USER_BLOCK.search(content)
    if block is None:
        return None
    text = block.group("text")
    facts: list[Fact] = []
    for pattern, key, template in _PATTERNS:
        for match in pattern.finditer(text):
            value = match.group("v").strip()
            if value:
                facts.append(Fact(key=key, text=template.format(v=value), confidence=0.9))
    return ExtractedFacts(facts=facts)
