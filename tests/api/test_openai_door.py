"""The OpenAI-compatible door in process: which session a conversation continues (nothing stored twice, nothing
merged), its streamed chunks, a hand-off said in the answer, and its refusals in OpenAI's error shape with the
right 4xx. (The official SDK against a live server of the app: tests/web/test_openai_sdk.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agents.models import Agent
from orchestrator.context import HANDOFF_NOTICE
from orchestrator.conversations import KEPT_FOR_PERSON
from sessions.models import ChatSession, Turn

pytestmark = pytest.mark.django_db

URL = "/v1/chat/completions"


def bearer(user: Any) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.key}")
    return client


def assert_openai_error(
    response: Any, status: int, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """An error as OpenAI sends it: ``{"error": {"message", "type", "param", "code"}}``, with this status."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


# A client-side tool as a chat UI sends it.
TOOL = {
    "type": "function",
    "function": {"name": "get_current_time", "parameters": {"type": "object", "properties": {}}},
}


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def _ask(client: APIClient, messages: list[dict[str, Any]], **extra: Any) -> Any:
    headers = extra.pop("headers", {})
    return client.post(URL, {"model": "chatty", "messages": messages, **extra}, format="json", headers=headers)


def test_a_resent_history_continues_its_session_and_a_retry_stores_nothing_twice(alice: Any, chat_agent: Agent) -> None:
    client = bearer(alice)
    first = _ask(client, [{"role": "system", "content": "Be brief."}, _user("My dog is called Rex.")])
    assert first.status_code == 200, first.content
    body = first.json()
    assert body["object"] == "chat.completion" and body["model"] == "chatty"
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] > 0
    session = ChatSession.objects.get(user=alice)
    assert body["session_id"] == first["X-Session-Id"] == str(session.pk)
    reply = body["choices"][0]["message"]["content"]
    assert reply == Turn.objects.get(session=session).assistant_message

    history = [_user("My dog is called Rex."), _assistant(reply), _user("What is my dog called?")]
    second = _ask(client, history)
    assert second.status_code == 200 and second.json()["session_id"] == str(session.pk)
    assert "Rex" in second.json()["choices"][0]["message"]["content"]
    # The SDK retries a request whose answer it did not get: the same turn again, not a second one.
    again = _ask(client, history)
    assert again.json()["choices"][0]["message"]["content"] == second.json()["choices"][0]["message"]["content"]
    assert ChatSession.objects.filter(user=alice).count() == 1
    assert list(Turn.objects.filter(session=session).values_list("user_message", flat=True)) == [
        "My dog is called Rex.",
        "What is my dog called?",
    ]


def test_a_named_session_continues_and_a_contradicting_history_is_refused(alice: Any, chat_agent: Agent) -> None:
    client = bearer(alice)
    session_id = _ask(client, [_user("Hello there")]).json()["session_id"]
    by_header = _ask(client, [_user("Second message")], headers={"X-Session-Id": session_id})
    by_metadata = _ask(client, [_user("Third message")], metadata={"session_id": session_id})
    assert by_header.json()["session_id"] == by_metadata.json()["session_id"] == session_id
    assert Turn.objects.filter(session_id=session_id).count() == 3

    wrong = _ask(
        client,
        [_user("Hello there"), _assistant("Something I never said."), _user("Go on")],
        metadata={"session_id": session_id},
    )
    assert_openai_error(wrong, 409, "history_mismatch")
    assert Turn.objects.filter(session_id=session_id).count() == 3  # nothing saved, nothing merged
    assert ChatSession.objects.filter(user=alice).count() == 1


def test_a_history_found_nowhere_starts_a_session_holding_it_which_the_next_request_finds(
    alice: Any, chat_agent: Agent
) -> None:
    client = bearer(alice)
    brought = [_user("I live in Porto."), _assistant("Nice city."), _user("Where do I live?")]
    first = _ask(client, brought)
    assert first.status_code == 200, first.content
    session = ChatSession.objects.get(pk=first.json()["session_id"])
    assert [t.user_message for t in Turn.objects.filter(session=session)] == ["I live in Porto.", "Where do I live?"]
    assert "Porto" in first.json()["choices"][0]["message"]["content"]  # the brought turn is in the prompt
    follow = [*brought, _assistant(first.json()["choices"][0]["message"]["content"]), _user("Thanks")]
    assert _ask(client, follow).json()["session_id"] == str(session.pk)
    assert ChatSession.objects.filter(user=alice).count() == 1


def test_another_users_session_is_not_found_like_a_missing_one(alice: Any, bob: Any, chat_agent: Agent) -> None:
    session_id = _ask(bearer(alice), [_user("Alice's secret is 4711.")]).json()["session_id"]
    theirs = _ask(bearer(bob), [_user("What is the secret?")], headers={"X-Session-Id": session_id})
    missing = _ask(
        bearer(bob), [_user("What is the secret?")], headers={"X-Session-Id": "00000000-0000-4000-8000-000000000000"}
    )
    assert assert_openai_error(theirs, 404, "session_not_found") == assert_openai_error(
        missing, 404, "session_not_found"
    )
    # Bob resending Alice's conversation lands in a session of his own, never in hers.
    alice_turn = Turn.objects.get(session_id=session_id)
    copied = _ask(
        bearer(bob), [_user(alice_turn.user_message), _assistant(alice_turn.assistant_message), _user("And?")]
    )
    assert copied.status_code == 200 and copied.json()["session_id"] != session_id
    assert Turn.objects.filter(session_id=session_id).count() == 1
    assert "4711" not in "".join(Turn.objects.filter(session__user=bob).values_list("assistant_message", flat=True)[1:])


def _chunks(response: Any) -> list[Any]:
    assert response["Content-Type"].startswith("text/event-stream")
    text = b"".join(response.streaming_content).decode()
    events = [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_a_streamed_answer_in_chunks_with_usage_and_a_hand_off_said_in_it(alice: Any, chat_agent: Agent) -> None:
    client = bearer(alice)
    response = _ask(client, [_user("Hello, who are you?")], stream=True, stream_options={"include_usage": True})
    chunks = _chunks(response)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    session = ChatSession.objects.get(pk=response["X-Session-Id"])
    assert text == Turn.objects.get(session=session).assistant_message

    history = [_user("Hello, who are you?"), _assistant(text), _user("I want to talk to a human, please.")]
    handed = _chunks(_ask(client, history, stream=True))
    said = "".join(c["choices"][0]["delta"].get("content") or "" for c in handed if c["choices"])
    assert HANDOFF_NOTICE in said
    session.refresh_from_db()
    assert session.status == ChatSession.Status.NEEDS_HUMAN
    # The chat goes on for the person at the desk: the next message is kept for them, and the client told so.
    later = _ask(client, [*history, _assistant(said), _user("Are you there?")])
    assert later.json()["choices"][0]["message"]["content"] == KEPT_FOR_PERSON
    assert later.json()["session_id"] == str(session.pk)
    assert Turn.objects.filter(session=session).count() == 3


def test_models_lists_the_active_agents(alice: Any, chat_agent: Agent, retired_agent: Agent) -> None:
    client = bearer(alice)
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == ["chatty"]
    assert client.get("/v1/models/chatty").json()["id"] == "chatty"
    assert_openai_error(client.get("/v1/models/retired"), 404, "model_not_found")


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"model": "nope", "messages": [_user("hi")]}, 404, "model_not_found", "model"),
        ({"model": "retired", "messages": [_user("hi")]}, 404, "model_not_found", "model"),
        ({"messages": [_user("hi")]}, 400, None, "model"),
        ({"model": "chatty", "messages": []}, 400, "empty_messages", "messages"),
        ({"model": "chatty"}, 400, "invalid_type", "messages"),
        ({"model": "chatty", "messages": [{"role": "system", "content": "x"}]}, 400, "empty_messages", "messages"),
        (
            {"model": "chatty", "messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]},
            400,
            "invalid_role",
            "messages[0].role",
        ),
        (
            {"model": "chatty", "messages": [{"role": "wizard", "content": "x"}]},
            400,
            "invalid_role",
            "messages[0].role",
        ),
        ({"model": "chatty", "messages": [_assistant("x")]}, 400, "invalid_conversation", "messages"),
        ({"model": "chatty", "messages": [_user("a"), _user("b")]}, 400, "invalid_conversation", "messages"),
        ({"model": "chatty", "messages": [_user("a"), _assistant("b")]}, 400, "invalid_conversation", "messages"),
        ({"model": "chatty", "messages": [_user("")]}, 400, "empty_message", None),
        ({"model": "chatty", "messages": [_user("a\x00b")]}, 400, "nul_bytes", "messages[0].content"),
        ({"model": "chatty", "messages": [_user("x" * 40_000)]}, 413, "message_too_long", None),
        (
            {"model": "chatty", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "unsupported_content",
            None,
        ),
        ({"model": "chatty", "messages": [_user("hi")], "n": 2}, 400, "unsupported_value", "n"),
        (
            {"model": "chatty", "messages": [_user("hi")], "tools": [TOOL], "tool_choice": "required"},
            400,
            "unsupported_parameter",
            "tool_choice",
        ),
        ({"model": "chatty", "messages": [_user("hi")], "stream": "yes"}, 400, "invalid_type", "stream"),
        ({"model": "chatty", "messages": "hi"}, 400, "invalid_type", "messages"),
        ({"model": 12, "messages": [_user("hi")]}, 400, "invalid_type", "model"),
        ([1, 2], 400, "invalid_body", None),
    ],
)
def test_bad_requests_are_openai_shaped_4xx_and_save_nothing(
    alice: Any, chat_agent: Agent, retired_agent: Agent, body: Any, status: int, code: str | None, param: str | None
) -> None:
    assert_openai_error(bearer(alice).post(URL, body, format="json"), status, code, param)
    assert not Turn.objects.exists() and not ChatSession.objects.exists()


def test_client_side_tools_are_left_out_and_the_agent_answers(alice: Any, chat_agent: Agent) -> None:
    """Chat UIs (Open WebUI) offer their own tools with every message: the agent answers with its own."""
    response = _ask(bearer(alice), [_user("Hello there")], tools=[TOOL], tool_choice="auto")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["choices"][0]["message"]["content"] and body["choices"][0]["finish_reason"] == "stop"
    assert Turn.objects.get().user_message == "Hello there"


def test_a_10_mb_body_and_a_stranger_are_refused_in_openai_shape(alice: Any, chat_agent: Agent) -> None:
    huge = json.dumps({"model": "chatty", "messages": [_user("x" * 10_000_000)]}).encode()
    response = bearer(alice).generic("POST", URL, huge, content_type="application/json")
    assert_openai_error(response, 413, "payload_too_large")
    assert_openai_error(APIClient().post(URL, {"model": "chatty", "messages": [_user("hi")]}, format="json"), 401)
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION="Bearer not-a-token")
    error = assert_openai_error(stranger.get("/v1/models"), 401)
    assert error["type"] == "authentication_error"
    assert_openai_error(bearer(alice).get("/v1/nothing/here"), 404, "not_found")
    assert not Turn.objects.exists()


def test_the_message_rate_limit_is_shared_with_the_api(
    alice: Any, chat_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rest_framework.throttling import SimpleRateThrottle

    from tests.api.conftest import token_client

    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "messages", "2/min")
    client = bearer(alice)
    assert _ask(client, [_user("one")]).status_code == 200
    session = ChatSession.objects.get(user=alice)
    api = token_client(alice)
    assert api.post(f"/api/sessions/{session.pk}/messages/", {"message": "two"}, format="json").status_code == 201
    refused = _ask(client, [_user("three")])
    error = assert_openai_error(refused, 429, "rate_limit_exceeded")
    assert error["type"] == "rate_limit_error" and refused["Retry-After"]
    assert client.get("/v1/models").status_code == 200  # listing models is not a message
    assert Turn.objects.count() == 2


def test_a_message_refused_before_it_is_saved_leaves_no_session_behind(
    alice: Any, chat_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator import runtime
    from orchestrator.worker import TurnsQueueFull

    def full() -> None:
        raise TurnsQueueFull()

    monkeypatch.setattr(runtime, "turns_queue_check", full)
    client = bearer(alice)
    for stream in (False, True):
        brought = [_user("I live in Porto."), _assistant("Nice city."), _user("Where do I live?")]
        assert_openai_error(_ask(client, brought, stream=stream), 503, "busy")
        assert_openai_error(_ask(client, [_user("Hello")], stream=stream), 503, "busy")
    assert not ChatSession.objects.exists() and not Turn.objects.exists()
