"""How the demo model reads what it is given: a message's text, its sentences and keywords, and whether the user
asks for a person (the one intent the demo recognises itself).
"""

from __future__ import annotations

import json
import re

from llm.base import Message

WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
STOPWORDS = frozenset(
    """a an the and or but if of to in on at for from by with about as is are was were be been being am do does
    did i me my you your we our it its this that these those what which who whom how when where why can could
    would should will shall may might must not no yes please thanks thank hi hello hey ok okay so just
    there here have has had want need like get""".split()
)


def split_sentences(text: str) -> list[str]:
    """Sentences and lines of ``text``, stripped; empty pieces dropped."""
    pieces: list[str] = []
    for line in text.splitlines():
        pieces.extend(p.strip() for p in re.split(r"(?<=[.!?])\s+", line))
    return [p for p in pieces if p]


def text_of(message: Message) -> str:
    """A message's content as text (content parts joined, anything else as JSON)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Content parts ({"type": "text", "text": ...}) as some clients send them.
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    if content is None:
        return ""
    return json.dumps(content)


# "I want to talk to a human", "can I speak with a person", "connect me to an agent", "real person please".
_SOMEONE = (
    r"(?:a\s+|an\s+|the\s+|some\s+)?(?:real\s+|live\s+|actual\s+|human\s+)?"
    r"(?:human(?:\s+being)?|person|people|operator|representative|rep|manager|supervisor|some\s*one|somebody|"
    r"(?:customer\s+)?(?:service|support)(?:\s+(?:agent|person|team))?|(?:human|live|real|support)\s+agent)"
)
_PERSON = re.compile(
    # "talk to a human", "speak with someone", "chat to a real person", "connect me to an operator"
    rf"\b(?:(?:talk|speak|chat)\s+(?:to|with)\s+{_SOMEONE}|(?:real|live)\s+(?:human|person|agent)|"
    r"(?:connect|transfer|put)\s+me\s+(?:to|through\s+to|with)\s+(?:a\s+|an\s+)?(?:human|person|agent|operator|"
    r"some\s*one|somebody)|"
    # "I'd like a person please", "can I get a human", "get me someone", "I need a real person"
    rf"(?:i'?d\s+like|i\s+would\s+like|i\s+want|i\s+need|can\s+i\s+(?:get|have)|could\s+i\s+(?:get|have)|"
    rf"may\s+i\s+have|get\s+me|give\s+me)\s+{_SOMEONE}\b(?!\s+(?:of|named|called))|"
    # "is there a human I can talk to?", "is anyone there who is human"
    rf"is\s+there\s+(?:a|any)\s+(?:real\s+)?(?:human|person|one|body)\b)\b"
    # "human please", "operator!", "a real person" (the whole message)
    rf"|^\W*{_SOMEONE}(?:\s+please)?\W*$",
    re.IGNORECASE,
)


def asks_for_person(text: str) -> bool:
    """The demo model's reading of "does the user ask for a person?" (a model answers it in the structured
    decision or the routing; the demo is not one)."""
    return bool(_PERSON.search(text))


def keywords(text: str) -> set[str]:
    """The words of ``text`` that say something (no stopwords, none shorter than three letters), lowercased and
    without a possessive or a plural's s ("dog's" and "dogs" are "dog")."""
    found = set()
    for word in WORD.findall(text.replace("\u2019", "'")):
        word = word.lower().removesuffix("'s").rstrip("'")
        if len(word) > 4 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        if word not in STOPWORDS and len(word) > 2:
            found.add(word)
    return found


def clip_words(text: str, limit: int) -> str:
    """``text``'s first ``limit`` words, and an ellipsis when there were more."""
    words = text.split()
    return " ".join(words) if len(words) <= limit else " ".join(words[:limit]) + " …"
