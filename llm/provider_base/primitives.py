"""What a provider's two primitives take and give back: the request keywords, a raw reply, a stream's chunks.

``_request(messages, **RequestParams)`` returns a ``RawCompletion``; ``_open_stream(messages, **StreamParams)``
an ``OpenedStream`` of ``StreamChunk``. Also the finish reasons that mean a reply is not whole, and the clock
that times a call.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypedDict

from pydantic import BaseModel

from llm.base import ToolCallRequest, ToolSpec

# Finish reasons that mean the reply is not whole. A stream that ends with no finish reason at all
# (the connection closed early) is treated the same way.
TRUNCATING_FINISH_REASONS = frozenset({"length", "content_filter"})
INCOMPLETE = "incomplete"


class StreamParams(TypedDict):
    """The keywords of ``_open_stream``, every one given: what the reply is asked with, why (the purpose), and the
    schema a structured reply must validate against (a streamed one: ``BaseProvider.stream_structured``)."""

    temperature: float | None
    max_tokens: int | None
    tools: list[ToolSpec] | None
    purpose: str
    schema: type[BaseModel] | None


class RequestParams(StreamParams):
    """The keywords of ``_request``: the same as a stream's."""


@dataclass
class RawCompletion:
    """One reply as a provider's transport returned it, before the shared checks."""

    text: str
    finish_reason: str
    model: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    retries: int = 0


@dataclass
class ToolCallDelta:
    """A piece of a streamed tool call: the first piece carries id and name, later ones more arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class StreamChunk:
    text: str = ""
    tool_call_deltas: list[ToolCallDelta] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model: str | None = None


@dataclass
class OpenedStream:
    """A stream whose request succeeded (after ``retries`` retries); chunks are read lazily."""

    chunks: Iterator[StreamChunk]
    retries: int = 0


def ms_since(started: float) -> float:
    """Milliseconds since ``started`` (a ``time.monotonic()`` reading)."""
    return (time.monotonic() - started) * 1000.0
