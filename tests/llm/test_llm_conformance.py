"""One conformance suite every provider passes: the demo model, the scripted fake, and the
OpenAI-compatible provider over real HTTP against the local fake server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from agents.models import LLMCall
from llm import demo
from llm.base import CallContext, LLMProvider, Message, ToolCallRequest, ToolSpec
from llm.demo import DemoModel, DemoReply
from llm.openai_compat import OpenAICompatibleProvider
from llm.profiles import EndpointProfile
from llm.scripted import ScriptedProvider, ScriptedReply
from tests.fakes import openai_server as fake

pytestmark = pytest.mark.django_db

MESSAGES = [
    {"role": "system", "content": "You are a travel assistant. Paris is the capital of France."},
    {"role": "user", "content": "What is the capital of France?"},
]
SCRIPTED_TEXT = "The capital of France is Paris, as far as I know."


class Slots(BaseModel):
    origin: str | None = None
    passengers: int | None = Field(default=None, ge=1, le=9)


class Decision(BaseModel):
    next_state: Literal["GATHERING", "CONFIRMING", "DONE"]
    slots: Slots
    confidence: float = Field(ge=0.0, le=1.0)
    reasoning: str
    notes: list[str]


DECISION = Decision(
    next_state="CONFIRMING", slots=Slots(origin="Berlin", passengers=2), confidence=0.9, reasoning="r", notes=[]
)


@dataclass
class Harness:
    """A provider plus a way to script its next answers (a no-op for the demo model, which decides itself)."""

    provider: LLMProvider
    kind: str
    server: fake.FakeOpenAIServer | None = None
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    @property
    def scripted(self) -> bool:
        return self.kind != "demo"

    def will_reply(self, text: str) -> None:
        if self.kind == "scripted":
            assert isinstance(self.provider, ScriptedProvider)
            self.provider.add(text)
        elif self.server is not None:
            self.server.enqueue(fake.reply(text))

    def will_stream(self, text: str, tool_calls: list[dict[str, Any]] | None = None) -> None:
        calls = [
            ToolCallRequest(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
            for c in tool_calls or []
        ]
        if self.kind == "demo" and calls:
            # The demo model calls tools only when a registered reply handler says so (as the booking workflow does).
            def handler(messages: list[Message], tools: list[ToolSpec] | None) -> DemoReply | None:
                return DemoReply(text=text, tool_calls=calls)

            demo.register_reply_handler(handler)
            self.cleanup.append(lambda: demo.unregister_reply_handler(handler))
        elif self.kind == "scripted":
            assert isinstance(self.provider, ScriptedProvider)
            self.provider.add(ScriptedReply(text=text, tool_calls=calls))
        elif self.server is not None:
            self.server.enqueue(
                fake.stream(text, tool_calls=tool_calls, finish_reason="tool_calls" if tool_calls else "stop")
            )

    def will_answer(self, obj: BaseModel) -> None:
        if self.kind == "scripted":
            assert isinstance(self.provider, ScriptedProvider)
            self.provider.add(obj)
        elif self.server is not None:
            self.server.enqueue(fake.json_reply(obj.model_dump(mode="json")))


@pytest.fixture(params=["demo", "scripted", "openai"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "demo":
        harness = Harness(provider=DemoModel(), kind="demo")
        yield harness
        for undo in harness.cleanup:
            undo()
    elif request.param == "scripted":
        yield Harness(provider=ScriptedProvider(), kind="scripted")
    else:
        with fake.FakeOpenAIServer() as server:
            profile = EndpointProfile.from_mapping("conformance", server.profile())
            yield Harness(provider=OpenAICompatibleProvider(profile=profile), kind="openai", server=server)


def test_complete_returns_a_whole_reply_and_records_it(harness: Harness) -> None:
    harness.will_reply(SCRIPTED_TEXT)
    completion = harness.provider.complete(MESSAGES, ctx=CallContext(purpose="reply"), max_tokens=200)

    assert completion.text.strip()
    assert completion.finish_reason == "stop"
    assert completion.is_demo is harness.provider.is_demo
    if harness.scripted:
        assert completion.text == SCRIPTED_TEXT
    else:
        assert "demo model, not an LLM" in completion.text
    call = LLMCall.objects.get()
    assert (call.outcome, call.purpose, call.provider, call.retries) == ("ok", "reply", harness.provider.name, 0)
    assert call.prompt_tokens > 0 and call.completion_tokens > 0
    assert call.finish_reason == "stop"


def test_stream_deltas_join_to_the_text_and_ttft_is_recorded(harness: Harness) -> None:
    harness.will_stream(SCRIPTED_TEXT)
    stream = harness.provider.stream(MESSAGES, ctx=CallContext(purpose="reply"), max_tokens=200)
    deltas = list(stream)

    assert len(deltas) > 1, "a stream arrives in pieces"
    assert stream.completion is not None
    assert "".join(deltas) == stream.completion.text
    if harness.scripted:
        assert stream.completion.text == SCRIPTED_TEXT
    assert stream.completion.ttft_ms is not None
    assert stream.completion.ttft_ms <= stream.completion.latency_ms
    call = LLMCall.objects.get()
    assert call.outcome == "ok"
    assert call.ttft_ms == pytest.approx(stream.completion.ttft_ms)
    assert call.completion_tokens > 0


def test_stream_accumulates_tool_calls(harness: Harness) -> None:
    call = fake.tool_call("book_flight", {"flight": "LH100", "passengers": 2}, call_id="call_9")
    harness.will_stream("", tool_calls=[call])
    stream = harness.provider.stream(MESSAGES, ctx=CallContext(purpose="reply"))
    assert list(stream) == []
    assert stream.completion is not None
    assert stream.completion.tool_calls == [
        ToolCallRequest(id="call_9", name="book_flight", arguments='{"flight": "LH100", "passengers": 2}')
    ]
    assert stream.completion.finish_reason == "tool_calls"
    assert LLMCall.objects.get().outcome == "ok"


def test_structured_returns_a_valid_instance(harness: Harness) -> None:
    harness.will_answer(DECISION)
    result = harness.provider.structured(MESSAGES, schema=Decision, ctx=CallContext(purpose="slots"))

    assert isinstance(result, Decision)
    Decision.model_validate(result.model_dump())
    if harness.scripted:
        assert result == DECISION
    call = LLMCall.objects.get()
    assert (call.outcome, call.purpose) == ("ok", "slots")


def test_call_context_reaches_the_record(harness: Harness) -> None:
    harness.will_reply(SCRIPTED_TEXT)
    sections = {"system": 12, "recent": 30}
    harness.provider.complete(MESSAGES, ctx=CallContext(purpose="summarize", prompt_sections=sections))
    call = LLMCall.objects.get()
    assert call.purpose == "summarize"
    assert call.prompt_sections == sections
    assert call.model == (harness.provider.model if harness.kind != "openai" else "fake-model")
