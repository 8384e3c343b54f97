"""The offline demo model: labelled, deterministic, extensible through its handler registry."""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Iterator
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from agents.models import LLMCall
from llm import demo
from llm.base import CallContext, Message, ToolCallRequest, ToolSpec, TruncatedOutputError
from llm.demo import DemoModel, DemoReply, generic_instance, registry
from llm.providers import DEMO_LABEL
from llm.tokens import counter_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """Tests register their own handlers; the app's handlers (if any are registered) come back afterwards."""
    with registry._lock:
        saved_structured = dict(registry._structured_handlers)
        saved_replies = list(registry._reply_handlers)
        registry._structured_handlers.clear()
        registry._reply_handlers.clear()
    yield
    with registry._lock:
        registry._structured_handlers.clear()
        registry._structured_handlers.update(saved_structured)
        registry._reply_handlers[:] = saved_replies


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Inner(BaseModel):
    code: Annotated[str, Field(min_length=3)]
    count: int = Field(gt=2)


class Everything(BaseModel):
    state: Literal["IDLE", "BUSY"]
    color: Color
    flag: bool
    score: float = Field(ge=0.25, le=1.0)
    label: str
    tags: list[str]
    pairs: list[Inner] = Field(min_length=1)
    inner: Inner
    mapping: dict[str, int]
    maybe: int | None
    when: dt.date
    kept: str = "default value"


class Fact(BaseModel):
    text: str


class Facts(BaseModel):
    facts: list[Fact]


class SpecialFacts(Facts):
    pass


def test_the_label_is_exported_and_shown() -> None:
    assert DEMO_LABEL == "demo model, not an LLM"
    model = DemoModel()
    assert model.is_demo and model.name == "demo" and model.model == "demo"


def test_default_reply_says_what_it_is_and_quotes_related_context(clean_registry: None) -> None:
    messages: list[Message] = [
        {"role": "system", "content": "Flights to Lisbon leave at 9:40. The office closes at noon."},
        {"role": "user", "content": "When do flights to Lisbon leave?"},
    ]
    completion = DemoModel().complete(messages, ctx=CallContext())
    assert completion.text.startswith(f"[{DEMO_LABEL}]")
    assert "Flights to Lisbon leave at 9:40." in completion.text
    assert "office closes" not in completion.text
    assert completion.is_demo
    # Deterministic: the same prompt gives the same reply.
    assert DemoModel().complete(messages, ctx=CallContext()).text == completion.text


def test_reply_handlers_run_in_order_and_none_falls_through(clean_registry: None) -> None:
    seen: list[str] = []

    def declines(messages: list[Message], tools: list[ToolSpec] | None) -> DemoReply | None:
        seen.append("declines")
        return None

    def answers(messages: list[Message], tools: list[ToolSpec] | None) -> DemoReply | None:
        seen.append("answers")
        return DemoReply(text=f"handled with {len(tools or [])} tools")

    def never(messages: list[Message], tools: list[ToolSpec] | None) -> DemoReply | None:
        seen.append("never")
        return DemoReply(text="too late")

    for handler in (declines, answers, never):
        demo.register_reply_handler(handler)
    tools = [ToolSpec(name="t", description="d", parameters={"type": "object"})]
    completion = DemoModel().complete([{"role": "user", "content": "hi"}], ctx=CallContext(), tools=tools)
    assert completion.text == "handled with 1 tools"
    assert seen == ["declines", "answers"]


def test_a_failing_handler_does_not_break_the_demo(clean_registry: None) -> None:
    def broken(messages: list[Message], tools: list[ToolSpec] | None) -> DemoReply | None:
        raise RuntimeError("bug in a handler")

    demo.register_reply_handler(broken)
    completion = DemoModel().complete([{"role": "user", "content": "hello"}], ctx=CallContext())
    assert completion.text.startswith(f"[{DEMO_LABEL}]")


def test_a_handler_can_call_tools_also_when_streaming(clean_registry: None) -> None:
    call = ToolCallRequest(id="demo_1", name="book_flight", arguments=json.dumps({"flight": "LH1"}))

    def books(messages: list[Message], tools: list[ToolSpec] | None) -> DemoReply | None:
        return DemoReply(text="Booking now.", tool_calls=[call])

    demo.register_reply_handler(books)
    stream = DemoModel().stream([{"role": "user", "content": "book it"}], ctx=CallContext())
    assert list(stream) == ["Booking ", "now."]
    assert stream.completion is not None
    assert stream.completion.tool_calls == [call]
    assert stream.completion.finish_reason == "tool_calls"


def test_streaming_yields_word_sized_deltas(clean_registry: None) -> None:
    stream = DemoModel().stream([{"role": "user", "content": "tell me about trains"}], ctx=CallContext())
    deltas = list(stream)
    assert stream.completion is not None
    assert "".join(deltas) == stream.completion.text
    assert len(deltas) == len(stream.completion.text.split())
    assert stream.completion.ttft_ms is not None


def test_the_token_limit_truncates_like_a_model_would(clean_registry: None) -> None:
    with pytest.raises(TruncatedOutputError) as info:
        DemoModel().complete([{"role": "user", "content": "a long question " * 20}], ctx=CallContext(), max_tokens=5)
    assert counter_for("demo").count(info.value.partial_text) == 5
    assert LLMCall.objects.get().outcome == "truncated"


def test_generic_instances_validate_for_awkward_schemas() -> None:
    instance = generic_instance(Everything)
    assert isinstance(instance, Everything)
    assert instance.state == "IDLE" and instance.color is Color.RED
    assert instance.score == 0.25 and instance.inner.count == 3 and len(instance.inner.code) == 3
    assert len(instance.pairs) == 1 and instance.kept == "default value"


def test_structured_uses_the_handler_for_the_schema_or_a_base_class(clean_registry: None) -> None:
    received: list[list[Message]] = []

    def extract(messages: list[Message]) -> BaseModel | None:
        received.append(messages)
        text = messages[-1]["content"]
        return Facts(facts=[Fact(text=text)]) if "my name is" in text else None

    demo.register_structured_handler(Facts, extract)
    messages: list[Message] = [{"role": "user", "content": "my name is Ada"}]
    assert DemoModel().structured(messages, schema=Facts, ctx=CallContext(purpose="extract")).facts == [
        Fact(text="my name is Ada")
    ]
    special = DemoModel().structured(messages, schema=SpecialFacts, ctx=CallContext(purpose="extract"))
    assert isinstance(special, SpecialFacts) and special.facts[0].text == "my name is Ada"
    # The handler declines: a generic, valid instance instead.
    declined = DemoModel().structured([{"role": "user", "content": "hello"}], schema=Facts, ctx=CallContext())
    assert declined == Facts(facts=[])
    assert received[0] == messages, "handlers see the caller's messages, not the provider's instructions"
    assert set(LLMCall.objects.values_list("outcome", "provider", "model")) == {("ok", "demo", "demo")}
    assert LLMCall.objects.count() == 3


def test_summaries_keep_facts_drop_filler_and_fit_the_budget(clean_registry: None) -> None:
    conversation: list[Message] = [
        {"role": "system", "content": "Summarize the conversation."},
        {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "I want to fly from Berlin to Lisbon on March 10."},
        {"role": "assistant", "content": "Okay."},
        {"role": "user", "content": "We decided on 2 passengers and a window seat."},
        {"role": "user", "content": "Thanks!"},
    ]
    completion = DemoModel().complete(conversation, ctx=CallContext(purpose="summarize"), max_tokens=200)
    assert "I want to fly from Berlin to Lisbon on March 10." in completion.text
    assert "We decided on 2 passengers and a window seat." in completion.text
    for filler in ("Hi there", "Thanks", "Okay", "Summarize the conversation"):
        assert filler not in completion.text

    tight = DemoModel().complete(conversation, ctx=CallContext(purpose="summarize"), max_tokens=12)
    assert 0 < counter_for("demo").count(tight.text) <= 12


def test_extractive_summary_keeps_what_the_user_said_about_themselves_and_drops_repeated_questions() -> None:
    from llm.demo import extractive_summary

    turns = [
        "User: I'm allergic to peanuts, please note it.\nAssistant: Noted. How many passengers are travelling (1-9)?",
        "User: let me think\nAssistant: Sure. How many passengers are travelling (1-9)?",
        "User: still thinking about the weather today\nAssistant: Take your time. How many passengers are travelling (1-9)?",
    ]
    summary = extractive_summary(turns, max_tokens=60)
    assert "allergic to peanuts" in summary
    assert "How many passengers" not in summary


def test_the_default_reply_quotes_what_it_remembers_and_what_was_said_never_its_instructions() -> None:
    """Issue 55: it said "I found nothing related" beside a matching memory ("dog's" against "dog"), quoted the
    agent's own prompt as something it "was told", and repeated a fact it had in two places."""
    from llm.demo import default_reply

    messages = [
        {
            "role": "system",
            "content": "You are a helpful assistant. Be kind about dogs.\n\n## What you remember about the user\n"
            "- The user's dog is called Rex.\n- I'm vegetarian.",
        },
        {"role": "user", "content": "I'm vegetarian."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "What is my dog's name? And am I vegetarian?"},
    ]
    reply = default_reply(messages)
    assert "I remember: The user's dog is called Rex." in reply
    assert reply.count("I'm vegetarian.") == 1  # a fact it had in two places, quoted once
    assert "helpful assistant" not in reply and "Be kind" not in reply
    recent = default_reply(
        [
            {"role": "user", "content": "My sister lives in Lyon."},
            {"role": "assistant", "content": "Ok."},
            {"role": "user", "content": "Where does my sister live?"},
        ]
    )
    assert "Earlier you said: My sister lives in Lyon." in recent
    nothing = default_reply(
        [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Which assistant?"}]
    )
    assert "Nothing I remember or that was said here matches that." in nothing
