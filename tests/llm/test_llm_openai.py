"""The OpenAI-compatible provider over real HTTP against the local fake server: retries, timeouts,
truncation, structured outputs with repair, tool calls and secrets. Each case checks its LLMCall."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from agents.models import LLMCall
from llm.base import (
    CallContext,
    LLMClientError,
    LLMError,
    LLMRateLimited,
    LLMServerError,
    LLMTimeout,
    StructuredOutputError,
    ToolSpec,
    TruncatedOutputError,
)
from llm.openai_compat import OpenAICompatibleProvider, backoff_delay, parse_retry_after, sse_data, stream_chunk
from llm.profiles import EndpointProfile
from tests.fakes import openai_server as fake
from tests.fakes.openai_server import FakeOpenAIServer

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
CTX = CallContext(purpose="reply")


class Route(BaseModel):
    intent: Literal["book", "chat"]
    confidence: float = Field(ge=0, le=1)


class SleepRecorder:
    """Stands in for time.sleep so a test sees the waits the provider chose without waiting them."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def make_provider(
    server: FakeOpenAIServer, sleep: Callable[[float], None] | None = None, **overrides: Any
) -> OpenAICompatibleProvider:
    profile = EndpointProfile.from_mapping("test", server.profile(**overrides))
    if sleep is None:
        return OpenAICompatibleProvider(profile=profile)
    return OpenAICompatibleProvider(profile=profile, sleep=sleep)


def only_call() -> LLMCall:
    return LLMCall.objects.get()


def test_200_reply_with_usage_from_the_server(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.reply("Hi!", prompt_tokens=21, completion_tokens=2))
    completion = make_provider(fake_openai).complete(MESSAGES, ctx=CTX, temperature=0.3, max_tokens=50)

    assert completion.text == "Hi!"
    sent = fake_openai.chat_requests()[0].body
    assert sent["model"] == "fake-model" and sent["messages"] == MESSAGES
    assert sent["temperature"] == 0.3 and sent["max_tokens"] == 50
    call = only_call()
    assert (call.outcome, call.retries, call.prompt_tokens, call.completion_tokens) == ("ok", 0, 21, 2)


def test_streaming_over_sse(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.stream("one two three"))
    stream = make_provider(fake_openai).stream(MESSAGES, ctx=CTX)
    assert list(stream) == ["one ", "two ", "three"]
    assert fake_openai.chat_requests()[0].body["stream"] is True
    call = only_call()
    assert call.outcome == "ok" and call.ttft_ms is not None and call.finish_reason == "stop"
    # The usage chunk the server sent at the end (stream_options.include_usage) is what is recorded.
    assert (call.prompt_tokens, call.completion_tokens) == (11, 3)


def test_429_with_retry_after_then_200_waits_what_the_server_asked(fake_openai: FakeOpenAIServer) -> None:
    sleep = SleepRecorder()
    fake_openai.enqueue(fake.error(429, "slow down", headers={"Retry-After": "3"}), fake.reply("ok now"))
    completion = make_provider(fake_openai, sleep=sleep).complete(MESSAGES, ctx=CTX)

    assert completion.text == "ok now" and completion.retries == 1
    assert sleep.delays == [3.0]
    assert len(fake_openai.chat_requests()) == 2
    call = only_call()
    assert (call.outcome, call.retries) == ("ok", 1)


def test_500_then_200_is_retried_with_backoff(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.error(500), fake.error(503), fake.reply("recovered"))
    completion = make_provider(fake_openai).complete(MESSAGES, ctx=CTX)
    assert completion.text == "recovered"
    assert len(fake_openai.chat_requests()) == 3
    assert (only_call().outcome, only_call().retries) == ("ok", 2)


def test_retries_run_out_and_are_counted(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(*[fake.error(500, "boom")] * 3)
    with pytest.raises(LLMServerError) as info:
        make_provider(fake_openai, max_retries=2).complete(MESSAGES, ctx=CTX)
    assert info.value.retries == 2
    assert len(fake_openai.chat_requests()) == 3
    call = only_call()
    assert (call.outcome, call.retries) == ("server_error", 2)
    assert "boom" in call.error


def test_a_hang_past_the_read_timeout_is_a_timeout(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.hang(3.0), fake.hang(3.0))
    with pytest.raises(LLMTimeout):
        make_provider(fake_openai, read_timeout=0.3, max_retries=1).complete(MESSAGES, ctx=CTX)
    assert len(fake_openai.chat_requests()) == 2
    call = only_call()
    assert (call.outcome, call.retries) == ("timeout", 1)


def test_a_hang_then_an_answer_recovers(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.hang(3.0), fake.reply("there you are"))
    completion = make_provider(fake_openai, read_timeout=0.3).complete(MESSAGES, ctx=CTX)
    assert completion.text == "there you are"
    assert (only_call().outcome, only_call().retries) == ("ok", 1)


@pytest.mark.parametrize("status", [400, 401, 404, 408, 409, 422])
def test_other_4xx_are_never_retried(fake_openai: FakeOpenAIServer, status: int) -> None:
    fake_openai.enqueue(fake.error(status, "bad request"), fake.reply("must not be reached"))
    with pytest.raises(LLMClientError):
        make_provider(fake_openai).complete(MESSAGES, ctx=CTX)
    assert len(fake_openai.chat_requests()) == 1
    assert fake_openai.pending() == 1
    call = only_call()
    assert (call.outcome, call.retries) == ("client_error", 0)
    assert str(status) in call.error


def test_a_retry_after_longer_than_allowed_is_not_waited_for(fake_openai: FakeOpenAIServer) -> None:
    sleep = SleepRecorder()
    fake_openai.enqueue(fake.error(429, headers={"Retry-After": "600"}), fake.reply("later"))
    with pytest.raises(LLMRateLimited) as info:
        make_provider(fake_openai, sleep=sleep, max_retry_after=30).complete(MESSAGES, ctx=CTX)
    assert info.value.retry_after == 600
    assert sleep.delays == []
    assert only_call().outcome == "rate_limited"


def test_finish_reason_length_is_truncation(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.reply("The answer is", finish_reason="length"))
    with pytest.raises(TruncatedOutputError) as info:
        make_provider(fake_openai).complete(MESSAGES, ctx=CTX, max_tokens=3)
    assert info.value.partial_text == "The answer is"
    call = only_call()
    assert (call.outcome, call.finish_reason) == ("truncated", "length")


def test_a_stream_cut_by_the_token_limit_raises_at_the_end(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.stream("The answer is", finish_reason="length"))
    stream = make_provider(fake_openai).stream(MESSAGES, ctx=CTX, max_tokens=3)
    received: list[str] = []
    with pytest.raises(TruncatedOutputError):
        for delta in stream:
            received.append(delta)
    assert "".join(received) == "The answer is"
    assert stream.completion is not None and stream.completion.finish_reason == "length"
    assert (only_call().outcome, only_call().finish_reason) == ("truncated", "length")


def test_a_stream_whose_connection_drops_is_truncated(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.stream("a much longer answer that never ends", cut_after=3))
    stream = make_provider(fake_openai).stream(MESSAGES, ctx=CTX)
    with pytest.raises(TruncatedOutputError):
        list(stream)
    assert only_call().outcome == "truncated"


def test_stream_opening_is_retried(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.error(502), fake.stream("fine"))
    stream = make_provider(fake_openai).stream(MESSAGES, ctx=CTX)
    assert "".join(stream) == "fine"
    assert (only_call().outcome, only_call().retries) == ("ok", 1)


def test_tool_calls_non_streamed_and_streamed(fake_openai: FakeOpenAIServer) -> None:
    tools = [ToolSpec(name="lookup", description="Look up a flight", parameters={"type": "object", "properties": {}})]
    call = fake.tool_call("lookup", {"code": "LH100"}, call_id="call_a")
    fake_openai.enqueue(fake.reply("", tool_calls=[call], finish_reason="tool_calls"))
    fake_openai.enqueue(fake.stream("", tool_calls=[call, {**call, "id": "call_b"}], finish_reason="tool_calls"))
    provider = make_provider(fake_openai)

    completion = provider.complete(MESSAGES, ctx=CTX, tools=tools)
    stream = provider.stream(MESSAGES, ctx=CTX, tools=tools)
    list(stream)

    assert [(c.id, c.name, json.loads(c.arguments)) for c in completion.tool_calls] == [
        ("call_a", "lookup", {"code": "LH100"})
    ]
    assert stream.completion is not None
    assert [(c.id, json.loads(c.arguments)) for c in stream.completion.tool_calls] == [
        ("call_a", {"code": "LH100"}),
        ("call_b", {"code": "LH100"}),
    ]
    assert fake_openai.chat_requests()[1].body["tools"] == [tools[0].as_openai()]
    assert list(LLMCall.objects.values_list("outcome", flat=True)) == ["ok", "ok"]


def test_structured_uses_json_schema_and_temperature_zero(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.json_reply({"intent": "book", "confidence": 0.8}))
    route = make_provider(fake_openai).structured(MESSAGES, schema=Route, ctx=CallContext(purpose="route"))
    assert route == Route(intent="book", confidence=0.8)
    body = fake_openai.chat_requests()[0].body
    assert body["temperature"] == 0
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == Route.model_json_schema()
    assert only_call().outcome == "ok"


def test_structured_in_plain_json_mode_puts_the_schema_in_the_prompt(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.json_reply({"intent": "chat", "confidence": 0.1}))
    provider = make_provider(fake_openai, structured_output="json_object")
    assert provider.structured(MESSAGES, schema=Route, ctx=CTX).intent == "chat"
    body = fake_openai.chat_requests()[0].body
    assert body["response_format"] == {"type": "json_object"}
    # JSON mode needs the schema in the prompt: it goes into the first system message.
    assert body["messages"][0]["role"] == "system" and '"intent"' in body["messages"][0]["content"]
    assert body["messages"][1:] == MESSAGES[1:]


# llama.cpp's server (llama-cpp-python 0.3.36) refuses json_schema like this.
LLAMA_CPP_REFUSAL = (
    '{"detail": [{"type": "literal_error", "loc": ["body", "response_format", "type"], '
    "\"msg\": \"Input should be 'text' or 'json_object'\"}]}"
)


def _refusal(status: int = 422, text: str = LLAMA_CPP_REFUSAL) -> fake.FakeResponse:
    return fake.FakeResponse(status=status, body=text)


def test_a_refused_json_schema_falls_back_to_a_json_object_with_the_schema_and_is_remembered(
    fake_openai: FakeOpenAIServer,
) -> None:
    from agents.models import EndpointCapability

    fake_openai.enqueue(_refusal(), fake.json_reply({"intent": "book", "confidence": 0.9}))
    provider = make_provider(fake_openai, max_retries=0)
    assert provider.structured(MESSAGES, schema=Route, ctx=CTX).intent == "book"
    first, second = (r.body["response_format"] for r in fake_openai.chat_requests())
    assert first["type"] == "json_schema"
    assert second == {"type": "json_object", "schema": Route.model_json_schema()}
    row = EndpointCapability.objects.get()
    assert (row.profile, row.base_url, row.model, row.structured_mode) == (
        "test",
        fake_openai.base_url,
        "fake-model",
        "json_object_schema",
    )
    assert "response_format" in row.detail

    # The next structured call (a new provider, as each turn makes) asks in the learned format at once.
    fake_openai.enqueue(fake.json_reply({"intent": "chat", "confidence": 0.5}))
    assert make_provider(fake_openai).structured(MESSAGES, schema=Route, ctx=CTX).intent == "chat"
    assert fake_openai.chat_requests()[2].body["response_format"]["type"] == "json_object"
    assert len(fake_openai.chat_requests()) == 3


def test_the_learned_format_is_read_from_the_database_by_a_fresh_process(fake_openai: FakeOpenAIServer) -> None:
    from agents.models import EndpointCapability
    from llm.capabilities import forget_all

    EndpointCapability.objects.create(
        profile="test", base_url=fake_openai.base_url, model="fake-model", structured_mode="json_object"
    )
    forget_all()  # as a new process starts
    fake_openai.enqueue(fake.json_reply({"intent": "chat", "confidence": 0.5}))
    make_provider(fake_openai).structured(MESSAGES, schema=Route, ctx=CTX)
    assert fake_openai.chat_requests()[0].body["response_format"] == {"type": "json_object"}


def test_each_refused_format_gives_way_to_the_next_down_to_plain_json_mode(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(
        _refusal(),
        _refusal(400, '{"error": {"message": "Unrecognized request argument: response_format.schema"}}'),
        fake.json_reply({"intent": "book", "confidence": 1}),
    )
    assert make_provider(fake_openai, max_retries=0).structured(MESSAGES, schema=Route, ctx=CTX).intent == "book"
    formats = [r.body["response_format"] for r in fake_openai.chat_requests()]
    assert [f["type"] for f in formats] == ["json_schema", "json_object", "json_object"]
    assert "schema" in formats[1] and formats[2] == {"type": "json_object"}


def test_a_client_error_about_something_else_is_not_taken_for_a_format_refusal(
    fake_openai: FakeOpenAIServer,
) -> None:
    from agents.models import EndpointCapability

    fake_openai.enqueue(fake.error(400, "model 'fake-model' not found"), fake.json_reply({"intent": "book"}))
    with pytest.raises(LLMClientError):
        make_provider(fake_openai, max_retries=0).structured(MESSAGES, schema=Route, ctx=CTX)
    assert len(fake_openai.chat_requests()) == 1
    assert not EndpointCapability.objects.exists()


def test_a_pinned_format_is_the_only_one_tried(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(_refusal(), fake.json_reply({"intent": "book", "confidence": 1}))
    with pytest.raises(LLMClientError):
        make_provider(fake_openai, max_retries=0, structured_output="json_schema").structured(
            MESSAGES, schema=Route, ctx=CTX
        )
    assert len(fake_openai.chat_requests()) == 1


def test_without_json_schema_support_learning_starts_at_the_json_object_with_a_schema(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(fake.json_reply({"intent": "chat", "confidence": 0.1}))
    make_provider(fake_openai, supports_json_schema=False).structured(MESSAGES, schema=Route, ctx=CTX)
    assert fake_openai.chat_requests()[0].body["response_format"] == {
        "type": "json_object",
        "schema": Route.model_json_schema(),
    }


def test_an_unknown_structured_output_setting_is_a_configuration_error(fake_openai: FakeOpenAIServer) -> None:
    from llm.base import LLMConfigurationError

    with pytest.raises(LLMConfigurationError, match="structured_output"):
        make_provider(fake_openai, structured_output="xml")


def test_invalid_structured_output_is_repaired_once(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(
        fake.reply('{"intent": "fly", "confidence": 2}'), fake.json_reply({"intent": "book", "confidence": 1})
    )
    route = make_provider(fake_openai).structured(MESSAGES, schema=Route, ctx=CallContext(purpose="route"))
    assert route.intent == "book"
    repair = fake_openai.chat_requests()[1].messages
    assert repair[-2] == {"role": "assistant", "content": '{"intent": "fly", "confidence": 2}'}
    assert "intent" in repair[-1]["content"] and "confidence" in repair[-1]["content"]
    outcomes = list(LLMCall.objects.order_by("id").values_list("outcome", flat=True))
    assert outcomes == ["invalid_output", "ok"]


def test_invalid_twice_raises_one_typed_error(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(fake.reply("Sure! The intent is book."), fake.reply('{"intent": "book"'))
    with pytest.raises(StructuredOutputError) as info:
        make_provider(fake_openai).structured(MESSAGES, schema=Route, ctx=CTX)
    assert info.value.raw == '{"intent": "book"'
    assert info.value.validation_error
    calls = list(LLMCall.objects.order_by("id").values_list("outcome", "error"))
    assert [o for o, _ in calls] == ["invalid_output", "invalid_output"]
    assert all(e for _, e in calls)


def test_the_api_key_is_sent_but_never_stored_or_logged(
    fake_openai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-test-0123456789abcdefSECRET"
    monkeypatch.setenv("FAKE_LLM_KEY", secret)
    # A server that echoes the key back in its error message (some gateways do).
    fake_openai.enqueue(fake.error(401, f"Incorrect API key provided: {secret}"))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(LLMClientError) as info:
        make_provider(fake_openai, api_key_env="FAKE_LLM_KEY").complete(MESSAGES, ctx=CTX)

    assert fake_openai.chat_requests()[0].headers["authorization"] == f"Bearer {secret}"
    assert secret not in str(info.value)
    call = only_call()
    assert "401" in call.error and secret not in call.error
    assert secret not in caplog.text


def test_backoff_grows_and_honours_retry_after() -> None:
    delays = [backoff_delay(n, base=1.0, cap=8.0) for n in range(6)]
    for attempt, delay in enumerate(delays):
        ceiling = min(8.0, 2.0**attempt)
        assert ceiling / 2 <= delay <= ceiling
    assert backoff_delay(0, base=1.0, cap=8.0, retry_after=4.5) == 4.5


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert parse_retry_after({}) is None


def test_the_fake_server_serves_embeddings_for_other_tests(fake_openai: FakeOpenAIServer) -> None:
    import openai

    client = openai.OpenAI(base_url=fake_openai.base_url, api_key="x", max_retries=0)
    result = client.embeddings.create(model="fake-embedding", input=["alpha", "beta", "alpha"])
    vectors = [d.embedding for d in result.data]
    assert len(vectors) == 3 and len(vectors[0]) == 384
    assert vectors[0] == vectors[2] != vectors[1]


class Note(BaseModel):
    text: str


def test_model_text_is_made_storable_nul_and_lone_surrogates(fake_openai: FakeOpenAIServer) -> None:
    """PostgreSQL stores neither NUL nor a lone surrogate (both arrive as JSON escapes): what the model says
    is stored as it is shown, with U+FFFD in their place, so a reply cannot fail its turn at the save."""
    fake_openai.enqueue(
        fake.reply("a\x00b\ud800c"),
        fake.stream("one\x00 two"),
        fake.json_reply({"text": "x\x00y"}),
        fake.reply("", tool_calls=[fake.tool_call("lookup", "a\x00b", call_id="c1")], finish_reason="tool_calls"),
    )
    provider = make_provider(fake_openai)

    assert provider.complete(MESSAGES, ctx=CTX).text == "a\ufffdb\ufffdc"
    assert "".join(provider.stream(MESSAGES, ctx=CTX)) == "one\ufffd two"
    assert provider.structured(MESSAGES, schema=Note, ctx=CTX).text == "x\ufffdy"
    [call] = provider.complete(MESSAGES, ctx=CTX).tool_calls
    assert "\x00" not in call.arguments and "\ufffd" in call.arguments
    assert LLMCall.objects.count() == 4 and set(LLMCall.objects.values_list("outcome", flat=True)) == {"ok"}


def test_a_character_split_across_stream_chunks_arrives_whole(fake_openai: FakeOpenAIServer) -> None:
    """A stream may send the two halves of an emoji (a surrogate pair, JSON-escaped) in two chunks: the reader
    sees the character, not two U+FFFD; a half whose pair never comes is still made storable."""
    fake_openai.enqueue(
        fake.stream(pieces=["smile ", "\ud83d", "\ude00", " and \ud83d", "\ude4f!", " cut \ud83d"]),
        fake.stream(
            tool_calls=[fake.tool_call("note", '{"text": "\ud83d\ude00"}', call_id="c1")],
            pieces=['{"text": "\ud83d', '\ude00"}'],
            finish_reason="tool_calls",
        ),
    )
    provider = make_provider(fake_openai)

    shown = list(provider.stream(MESSAGES, ctx=CTX))
    assert "".join(shown) == "smile \U0001f600 and \U0001f64f! cut \ufffd"
    assert all(piece.encode("utf-8") for piece in shown)  # every piece is shown as it is stored
    note = ToolSpec(name="note", description="Take a note", parameters={"type": "object", "properties": {}})
    stream = provider.stream(MESSAGES, ctx=CTX, tools=[note])
    assert list(stream) == []
    assert stream.completion is not None
    [call] = stream.completion.tool_calls
    assert json.loads(call.arguments) == {"text": "\U0001f600"}
    saved = LLMCall.objects.order_by("pk").values_list("outcome", flat=True)
    assert list(saved) == ["ok", "ok"]


def test_a_json_nul_escape_in_structured_output_is_made_storable() -> None:
    from llm.provider_base import parse_structured

    assert parse_structured('{"text": "x\\u0000y"}', Note).text == "x\ufffdy"
    assert parse_structured('{"text": "x\\U0000y"}', Note).text == "x\ufffdy"
    # An escaped backslash before "u0000" is the text "\u0000", not a NUL: left alone.
    assert parse_structured('{"text": "x\\\\u0000y"}', Note).text == "x\\u0000y"


def test_a_server_that_reports_a_refused_format_as_a_500_is_not_retried_and_falls_back(
    fake_openai: FakeOpenAIServer,
) -> None:
    # llama-cpp-python 0.3.36's server answers an unknown response_format with a 500 and pydantic's words.
    body = {
        "error": {
            "message": "1 validation error: {'type': 'literal_error', 'loc': ('body', 'response_format', "
            "'type'), 'msg': \"Input should be 'text' or 'json_object'\"}",
            "type": "internal_server_error",
        }
    }
    fake_openai.enqueue(fake.FakeResponse(status=500, body=body), fake.json_reply({"intent": "book", "confidence": 1}))
    assert make_provider(fake_openai, max_retries=2).structured(MESSAGES, schema=Route, ctx=CTX).intent == "book"
    assert [r.body["response_format"]["type"] for r in fake_openai.chat_requests()] == ["json_schema", "json_object"]


def test_a_forced_tool_is_sent_as_tool_choice(fake_openai: FakeOpenAIServer) -> None:
    spec = ToolSpec(name="lookup", description="Look up.", parameters={"type": "object", "properties": {}})
    forced = ToolSpec(name="book", description="Book.", parameters={"type": "object", "properties": {}}, forced=True)
    fake_openai.enqueue(fake.reply("ok"), fake.reply("ok"))
    make_provider(fake_openai).complete(MESSAGES, ctx=CTX, tools=[spec, forced])
    make_provider(fake_openai).complete(MESSAGES, ctx=CTX, tools=[spec])
    first, second = (r.body for r in fake_openai.chat_requests())
    assert first["tool_choice"] == {"type": "function", "function": {"name": "book"}}
    assert "forced" not in json.dumps(first["tools"])
    assert "tool_choice" not in second


def test_a_tool_name_repeated_in_every_streamed_delta_is_taken_once(fake_openai: FakeOpenAIServer) -> None:
    # llama-cpp-python's server repeats id and name in each tool-call delta; OpenAI sends them once.
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    pieces = ['{"code"', ': "LH1', '00"}']
    chunks = [
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_x",
                                "type": "function",
                                "function": {"name": "lookup", "arguments": piece},
                            }
                        ]
                    },
                }
            ],
        }
        for piece in pieces
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    fake_openai.enqueue(fake.FakeResponse(stream=chunks))
    stream = make_provider(fake_openai).stream(MESSAGES, ctx=CTX)
    list(stream)
    assert stream.completion is not None
    assert [(c.id, c.name, json.loads(c.arguments)) for c in stream.completion.tool_calls] == [
        ("call_x", "lookup", {"code": "LH100"})
    ]


def test_an_error_event_mid_stream_raises_after_the_words_before_it(fake_openai: FakeOpenAIServer) -> None:
    """The stream is read as plain server-sent events (``llm.openai_compat.sse_data``): an ``error`` payload
    after some words raises an LLMError with the server's message, as the SDK's typed stream did."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake-model"}
    words = [{**base, "choices": [{"index": 0, "delta": {"content": w}}]} for w in ("one ", "two ")]
    fake_openai.enqueue(fake.FakeResponse(stream=[*words, {"error": {"message": "the model is overloaded"}}]))
    stream = make_provider(fake_openai).stream(MESSAGES, ctx=CTX)
    got: list[str] = []
    with pytest.raises(LLMError, match="the model is overloaded"):
        for piece in stream:
            got.append(piece)
    assert got == ["one ", "two "]


def test_server_sent_events_are_read_as_the_standard_says() -> None:
    lines = [": a comment", "event: chunk", 'data: {"a":', "data:1}", "", "", "data: [DONE]", ""]
    assert list(sse_data(iter(lines))) == ['{"a":\n1}', "[DONE]"]
    assert list(sse_data(iter(["data: last, with no blank line after it"]))) == ["last, with no blank line after it"]


def test_a_chunk_with_fields_of_the_wrong_type_keeps_what_it_can() -> None:
    chunk = stream_chunk(
        {
            "model": None,
            "usage": "n/a",
            "choices": [
                "not a choice",
                {"delta": {"content": None, "tool_calls": "nope"}},
                {
                    "delta": {
                        "content": "ok",
                        "tool_calls": [{"index": "x", "function": {"name": 3, "arguments": "{}"}}],
                    }
                },
                {"delta": None, "finish_reason": "length"},
            ],
        }
    )
    assert (chunk.text, chunk.model, chunk.prompt_tokens, chunk.finish_reason) == ("ok", None, None, "length")
    assert [(d.index, d.id, d.name, d.arguments) for d in chunk.tool_call_deltas] == [(0, None, None, "{}")]
