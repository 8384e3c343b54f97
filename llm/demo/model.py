"""``DemoModel``, the offline demo model as a provider: it answers from its replies, summaries and structured
instances, honours the token limit, continues a reply it cut off, and streams in word-sized chunks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Unpack

from llm.base import Message
from llm.continuation import continued_partial
from llm.demo.reading import text_of
from llm.demo.registry import DEMO_MODEL_NAME, DemoReply
from llm.demo.replies import demo_reply
from llm.demo.structured import structured_instance
from llm.demo.summaries import extractive_summary
from llm.provider_base import BaseProvider, OpenedStream, RawCompletion, StreamChunk, ToolCallDelta
from llm.provider_base.primitives import RequestParams, StreamParams
from llm.tokens import counter_for


class DemoModel(BaseProvider):
    """The offline stand-in for a model (see the ``llm.demo`` docstring)."""

    name = "demo"
    is_demo = True

    def __init__(self) -> None:
        super().__init__(model=DEMO_MODEL_NAME)

    def decides_in_reply(self) -> bool:
        return True  # its replies call the tools they are offered (the hand-off, a workflow's action)

    def streams_decisions(self) -> bool:
        return True  # a structured reply streams as its JSON (``llm.demo.structured``: the decision, then the reply)

    def _request(self, messages: list[Message], **params: Unpack[RequestParams]) -> RawCompletion:
        schema, max_tokens = params["schema"], params["max_tokens"]
        if schema is not None:
            instance = structured_instance(schema, messages)
            return RawCompletion(text=instance.model_dump_json(), finish_reason="stop", model=self.model)
        if params["purpose"] == "summarize":
            texts = [text_of(m) for m in messages if m.get("role") != "system"]
            summary = extractive_summary(texts, max_tokens=max_tokens or 256)
            return RawCompletion(text=summary, finish_reason="stop", model=self.model)
        partial = continued_partial(messages)
        if partial is not None:
            # Asked to go on after a cut-off reply: the rest of the reply it would have given (a real model
            # continues its own words; the demo's are deterministic, so the rest is known).
            whole_reply: RequestParams = {**params, "max_tokens": None, "schema": None}
            whole = self._request(messages[:-2], **whole_reply).text
            rest = whole[len(partial) :] if whole.startswith(partial) else ""
            reply = DemoReply(text=rest)
        else:
            reply = demo_reply(messages, params["tools"])
        text, finish = reply.text, "tool_calls" if reply.tool_calls else "stop"
        # The demo honours the token limit like a model would, so truncation handling is exercised too.
        if max_tokens is not None and counter_for(self.model).count(text) > max_tokens:
            # Cut where a model's stream would: on a whole character (a token can hold half of one).
            text, finish = counter_for(self.model).truncate(text, max_tokens).rstrip("\ufffd"), "length"
        return RawCompletion(text=text, finish_reason=finish, model=self.model, tool_calls=reply.tool_calls)

    def _open_stream(self, messages: list[Message], **params: Unpack[StreamParams]) -> OpenedStream:
        # A streamed structured reply (``stream_structured``) is its instance's JSON, streamed like any text.
        raw = self._request(messages, **params)
        return OpenedStream(chunks=word_chunks(raw))


def word_chunks(raw: RawCompletion) -> Iterator[StreamChunk]:
    """A completion as a model streams it: word-sized deltas (each word with the whitespace after it), then the
    tool calls, then the finish reason."""
    for word in re.findall(r"\s*\S+\s*", raw.text):
        yield StreamChunk(text=word)
    for index, call in enumerate(raw.tool_calls):
        yield StreamChunk(tool_call_deltas=[ToolCallDelta(index=index, id=call.id, name=call.name)])
        yield StreamChunk(tool_call_deltas=[ToolCallDelta(index=index, arguments=call.arguments)])
    yield StreamChunk(finish_reason=raw.finish_reason, model=raw.model)
