"""A scripted provider for tests: answers from a queue and records every call like the real ones.

Queue items, consumed one per model call (a structured call that needs its repair attempt
consumes two):

- ``str``: a reply text (for ``structured``: the raw text the "model" sent, valid JSON or not);
- ``ScriptedReply``: text, tool calls, finish reason and token usage under the test's control;
- a pydantic model instance or a ``dict``: a structured answer (sent as its JSON);
- an exception instance (e.g. ``LLMRateLimited("…")``): raised by that call, as a transport error.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Unpack

from pydantic import BaseModel

from llm.base import LLMError, Message, ToolCallRequest, ToolSpec
from llm.provider_base import BaseProvider, OpenedStream, RawCompletion, StreamChunk, ToolCallDelta
from llm.provider_base.primitives import RequestParams, StreamParams

ScriptItem = Any  # str | ScriptedReply | BaseModel | dict | BaseException


@dataclass
class ScriptedReply:
    text: str = ""
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # For streams: end without a finish reason, as when a connection is cut mid-reply.
    cut_stream: bool = False


@dataclass
class ScriptedRequest:
    """What a call asked for, for tests to assert on."""

    messages: list[Message]
    temperature: float | None
    max_tokens: int | None
    tools: list[ToolSpec] | None
    schema: type[BaseModel] | None
    purpose: str
    streamed: bool


class ScriptedProvider(BaseProvider):
    name = "scripted"

    def __init__(
        self,
        items: Iterable[ScriptItem] = (),
        *,
        model: str = "scripted",
        default: ScriptItem = None,
        decides_in_reply: bool = False,
        streams_decisions: bool = False,
    ) -> None:
        super().__init__(model=model)
        self._decides_in_reply = decides_in_reply
        self._streams_decisions = streams_decisions
        self._queue: deque[ScriptItem] = deque(items)
        self._default = default
        self._lock = threading.Lock()
        self.requests: list[ScriptedRequest] = []

    def decides_in_reply(self) -> bool:
        return self._decides_in_reply

    def streams_decisions(self) -> bool:
        return self._streams_decisions

    def add(self, *items: ScriptItem) -> ScriptedProvider:
        with self._lock:
            self._queue.extend(items)
        return self

    @property
    def remaining(self) -> int:
        return len(self._queue)

    def _next(self, request: ScriptedRequest) -> ScriptedReply:
        with self._lock:
            self.requests.append(request)
            item = self._queue.popleft() if self._queue else self._default
        if item is None:
            raise LLMError("the scripted provider has no reply queued")
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, ScriptedReply):
            return item
        if isinstance(item, BaseModel):
            return ScriptedReply(text=item.model_dump_json())
        if isinstance(item, dict):
            return ScriptedReply(text=json.dumps(item))
        return ScriptedReply(text=str(item))

    def _request(self, messages: list[Message], **params: Unpack[RequestParams]) -> RawCompletion:
        reply = self._next(ScriptedRequest(list(messages), streamed=False, **params))
        finish = reply.finish_reason
        if reply.tool_calls and finish == "stop":
            finish = "tool_calls"
        return RawCompletion(
            text=reply.text,
            finish_reason=finish,
            model=self.model,
            tool_calls=list(reply.tool_calls),
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
        )

    def _open_stream(self, messages: list[Message], **params: Unpack[StreamParams]) -> OpenedStream:
        reply = self._next(ScriptedRequest(list(messages), streamed=True, **params))
        chunks: list[StreamChunk] = [StreamChunk(text=piece) for piece in _pieces(reply.text)]
        for index, call in enumerate(reply.tool_calls):
            chunks.append(StreamChunk(tool_call_deltas=[ToolCallDelta(index=index, id=call.id, name=call.name)]))
            half = len(call.arguments) // 2
            chunks.append(StreamChunk(tool_call_deltas=[ToolCallDelta(index=index, arguments=call.arguments[:half])]))
            chunks.append(StreamChunk(tool_call_deltas=[ToolCallDelta(index=index, arguments=call.arguments[half:])]))
        if not reply.cut_stream:
            finish = "tool_calls" if reply.tool_calls and reply.finish_reason == "stop" else reply.finish_reason
            chunks.append(
                StreamChunk(
                    finish_reason=finish,
                    prompt_tokens=reply.prompt_tokens,
                    completion_tokens=reply.completion_tokens,
                )
            )
        return OpenedStream(chunks=iter(chunks))


def _pieces(text: str) -> list[str]:
    # Word-sized deltas that join back to exactly the text.
    pieces: list[str] = []
    current = ""
    for char in text:
        current += char
        if char.isspace():
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    return pieces
