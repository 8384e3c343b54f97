"""Text as PostgreSQL can store it, with no database at hand: the llm library and the tools use these on
what comes from outside (model output, tool results). Pure functions: no ORM."""

from __future__ import annotations

import re
from typing import Any


def storable_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL and lone surrogates (from a JSON "\\ud800" escape) become
    U+FFFD; the two halves of a pair (escaped apart, "\\ud83d" and "\\ude00", as a stream can send them)
    become the one character they stand for. For text from outside that must not be refused: model
    output, tool results. (User input is refused instead, with a clear error:
    ``orchestrator.runtime.validate_message``.)"""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Through UTF-16: a high surrogate followed by a low one decodes to their character, any other
        # surrogate to U+FFFD.
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def hold_high_surrogate(text: str) -> tuple[str, str]:
    """``text`` split before a high surrogate that ends it: (what can be shown now, what waits for the next
    piece). A stream may send the two halves of a character (an emoji) in two chunks; shown apart, each
    would be a lone surrogate, and ``storable_text`` would turn the character into two U+FFFD."""
    if text and "\ud800" <= text[-1] <= "\udbff":
        return text[:-1], text[-1]
    return text, ""


def storable_json(value: Any) -> Any:
    """``storable_text`` over every string (keys included) of a parsed JSON value: a JSON "\\u0000" escape
    parses to a NUL, which a jsonb column refuses as much as a text one."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_json(k): storable_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable_json(v) for v in value]
    return value


def camel_case(name: str, *, default: str = "Model") -> str:
    """``name`` ("flight_booking", "look-up") as a class name ("FlightBooking", "LookUp"): the generated
    pydantic models of tools and workflows are named this way."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part) or default


def state_words(name: Any) -> str:
    """A name as words a person reads ("GATHERING_ORIGIN" → "Gathering origin")."""
    text = str(name or "").replace("_", " ").strip().lower()
    return text[:1].upper() + text[1:]


def title_from(message: str, limit: int = 80) -> str:
    """A chat's title from its first message: the first line, cut at a word's end (with "…") when it is longer
    than ``limit`` characters, never in the middle of a word."""
    lines = message.strip().splitlines()
    line = " ".join(lines[0].split()) if lines else ""
    if len(line) <= limit:
        return line
    cut = line[: limit - 1].rsplit(" ", 1)[0] if " " in line[: limit - 1] else line[: limit - 1]
    return cut.rstrip(" ,;:.-") + "…"
