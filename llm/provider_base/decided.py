"""A structured reply whose last field is the text the user reads (``REPLY_FIELD``), streamed while it is written.

``BaseProvider.stream_structured`` asks for one JSON object (in the format the endpoint takes, as every structured
call) and streams it; ``DecidedStream`` reads it as it comes, with pydantic's partial JSON parsing: once the
fields before the reply are written (the decision) it yields them as one ``Decided``, then the reply's text as
deltas, while the model is still writing it. The caller acts on the decision before a word of the reply is shown,
and may stop the call there (``stop``). At the end ``instance`` is the whole object, validated like any structured
output; an object that is not valid raises ``StructuredOutputError`` (there is no repair attempt: the reply was
streamed). A model that writes the reply before the decision (a server that ignores the schema's order) is read
whole first: its decision, then its reply in one delta.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic

from pydantic_core import from_json

from llm.base import Completion, SchemaT, StructuredOutputError
from llm.provider_base.streaming import RecordedStream
from llm.provider_base.structured import parse_structured

# The field a streamed structured reply ends with: the text shown to the user.
REPLY_FIELD = "reply"


def streams_reply(schema: type[Any]) -> bool:
    """Is ``schema`` a structured reply (its last field ``REPLY_FIELD``)?"""
    fields = list(getattr(schema, "model_fields", {}))
    return bool(fields) and fields[-1] == REPLY_FIELD


@dataclass(frozen=True)
class Decided:
    """The fields written before the reply: the decision, as the model wrote it (not validated yet)."""

    fields: dict[str, Any]


class DecidedStream(Generic[SchemaT]):
    """Iterate once: a ``Decided`` (exactly once), then the reply's text deltas. Afterwards ``instance`` holds the
    validated object and ``completion`` the call's figures; ``stop`` ends the call early, on purpose."""

    def __init__(self, stream: RecordedStream, schema: type[SchemaT]) -> None:
        self._stream = stream
        self._schema = schema
        self._required = [
            name for name, field in schema.model_fields.items() if field.is_required() and name != REPLY_FIELD
        ]
        self.instance: SchemaT | None = None
        self.raw = ""

    @property
    def completion(self) -> Completion | None:
        return self._stream.completion

    def stop(self) -> None:
        """Stop reading: the rest of the reply is not needed (recorded as stopped, not as a failure)."""
        self._stream.stop()

    def __iter__(self) -> Iterator[Decided | str]:
        parts: list[str] = []
        decided = False
        shown = ""
        for delta in self._stream:
            parts.append(delta)
            parsed = _partial("".join(parts))
            if parsed is None or REPLY_FIELD not in parsed:
                continue
            if not decided:
                if list(parsed)[-1] != REPLY_FIELD or any(name not in parsed for name in self._required):
                    continue  # the reply came before the decision: read the whole object first
                decided = True
                yield Decided({k: v for k, v in parsed.items() if k != REPLY_FIELD})
            text = parsed[REPLY_FIELD]
            if isinstance(text, str) and len(text) > len(shown) and text.startswith(shown):
                yield text[len(shown) :]
                shown = text
        self.raw = "".join(parts)
        try:
            self.instance = parse_structured(self.raw, self._schema)
        except ValueError as exc:
            raise StructuredOutputError(
                f"no valid {self._schema.__name__} in the streamed reply: {str(exc)[:500]}",
                raw=self.raw,
                validation_error=str(exc),
            ) from exc
        whole = self.instance.model_dump()
        if not decided:
            yield Decided({k: v for k, v in whole.items() if k != REPLY_FIELD})
        text = str(whole.get(REPLY_FIELD) or "")
        if text.startswith(shown) and len(text) > len(shown):
            yield text[len(shown) :]


def _partial(text: str) -> dict[str, Any] | None:
    """The object written so far (its last string cut where the text ends), or None before it is one."""
    body = text.lstrip()
    if not body.startswith("{"):
        return None
    try:
        parsed = from_json(body, allow_partial="trailing-strings")
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None
