"""What every provider shares: timing, truncation checks, structured outputs with one repair, records.

A provider implements two primitives: ``_request`` (one reply, with its transport retries) and
``_open_stream`` (a reply as chunks). ``BaseProvider`` turns them into the public ``complete``,
``stream`` and ``structured`` calls, so that the demo model, the scripted fake and a real endpoint
behave alike, and every call leaves exactly one ``LLMCall`` row whatever happens.

Its modules:
- ``primitives``: what the two primitives take (``RequestParams``, ``StreamParams``) and give back
  (``RawCompletion``, ``OpenedStream`` of ``StreamChunk``);
- ``provider``: ``BaseProvider``, the public calls and their records;
- ``structured``: the schema instruction, the schemas built once, decoding a reply, the repair request;
- ``streaming``: ``RecordedStream``, a streamed reply read, joined and recorded;
- ``decided``: ``DecidedStream``, a structured reply whose decision comes first and whose text is streamed.
"""

from llm.provider_base.decided import REPLY_FIELD, Decided, DecidedStream, streams_reply
from llm.provider_base.primitives import (
    INCOMPLETE,
    TRUNCATING_FINISH_REASONS,
    OpenedStream,
    RawCompletion,
    RequestParams,
    StreamChunk,
    StreamParams,
    ToolCallDelta,
)
from llm.provider_base.provider import BaseProvider
from llm.provider_base.streaming import RecordedStream
from llm.provider_base.structured import json_schema_of, parse_structured, schema_instruction

__all__ = [
    "INCOMPLETE",
    "REPLY_FIELD",
    "Decided",
    "DecidedStream",
    "streams_reply",
    "TRUNCATING_FINISH_REASONS",
    "BaseProvider",
    "OpenedStream",
    "RawCompletion",
    "RecordedStream",
    "RequestParams",
    "StreamChunk",
    "StreamParams",
    "ToolCallDelta",
    "json_schema_of",
    "parse_structured",
    "schema_instruction",
]
