"""Structured outputs: the instruction that asks for one JSON object, the schemas (built once per class), the
decoding of a reply into a validated instance, and the messages of the one repair attempt.

``BaseProvider.structured`` runs the attempts; an endpoint's ``response_format`` is ``llm.capabilities``'.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import weakref
from typing import Any

from pydantic import BaseModel, ValidationError

from llm.base import Message, SchemaT

# A JSON "\u0000" escape (not preceded by an escaped backslash): parsed, it is a NUL that PostgreSQL refuses.
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000", re.IGNORECASE)


def parse_structured(text: str, schema: type[SchemaT]) -> SchemaT:
    """Validate a reply as one JSON object of ``schema``; raise ``ValueError`` with a readable reason.

    Only a Markdown code fence around the object is tolerated: anything else (prose around it,
    a half object) is invalid, so control flow never runs on a guess.
    """
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
        body = body.strip()
    if not body:
        raise ValueError("the reply was empty; expected one JSON object")
    body = _NUL_ESCAPE.sub(r"\1\\ufffd", body)
    try:
        return schema.model_validate_json(body)
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()[:10]
        )
        raise ValueError(errors or str(exc)) from exc


def repair_messages(messages: list[Message], *, reply: str, schema: type[BaseModel], error: str) -> list[Message]:
    """The repair attempt's request: the messages, what the model said, and why it was rejected."""
    return [
        *messages,
        {"role": "assistant", "content": reply},
        {
            "role": "user",
            "content": (
                f"Your reply was not a valid {schema.__name__} object: {error}. "
                "Reply again with only one JSON object that fixes this."
            ),
        },
    ]


# Each model class's JSON schema and its compact text, built once: pydantic builds the schema afresh on every
# ``model_json_schema()`` (about a millisecond for a workflow decision), and every structured call needs it twice
# (the instruction and ``response_format``): an eighth of a turn worker's CPU at 64 chats at once. Weak keys: a
# class made at run time (a workflow defined in the admin) is forgotten with it.
_schemas: weakref.WeakKeyDictionary[type[BaseModel], tuple[dict[str, Any], str]] = weakref.WeakKeyDictionary()
_schemas_lock = threading.Lock()


def _schema_of(schema: type[BaseModel]) -> tuple[dict[str, Any], str]:
    with _schemas_lock:
        known = _schemas.get(schema)
    if known is None:
        built = schema.model_json_schema()
        known = (built, json.dumps(built, separators=(",", ":")))
        if not _built_each_time(schema):
            with _schemas_lock:
                _schemas[schema] = known
    return known


def _built_each_time(schema: type[BaseModel]) -> bool:
    """Does ``schema`` compute a part of its JSON schema when it is built (a ``json_schema_extra`` function, of the
    model or of a field: a limit read from the settings)? Such a schema is not kept."""
    extras = [schema.model_config.get("json_schema_extra")]
    extras += [field.json_schema_extra for field in schema.model_fields.values()]
    return any(callable(extra) for extra in extras)


def json_schema_of(schema: type[BaseModel]) -> dict[str, Any]:
    """``schema.model_json_schema()``, built once per class (a copy: the caller may change it)."""
    return copy.deepcopy(_schema_of(schema)[0])


def schema_instruction(schema: type[BaseModel]) -> str:
    """The instruction that asks a model for one JSON object of ``schema`` (used by JSON mode too)."""
    return (
        "Reply with exactly one JSON object and nothing else (no prose, no code fence). "
        f"It must validate against this JSON schema:\n{_schema_of(schema)[1]}"
    )
