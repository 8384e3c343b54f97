"""Sessions, messages (plain, idempotent, streamed), state, checkpoints and a turn's composition."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.models import Agent
from llm.providers import DEMO_LABEL
from sessions.locks import session_is_locked
from sessions.models import ChatSession, Checkpoint, Turn
from tests.api.conftest import assert_error
from tests.html_checks import active_parts


def _events(response: Any) -> list[tuple[str, dict[str, Any]]]:
    """Parse a text/event-stream body into (event, data) pairs."""
    raw = b"".join(response.streaming_content).decode()
    events = []
    for block in raw.split("\n\n"):
        kind, data = "message", None
        for line in block.splitlines():
            if line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                data = json.loads(line[5:])
        if data is not None:
            events.append((kind, data))
    return events


@pytest.fixture
def session_id(alice_client: APIClient, booking_agent: Agent) -> str:
    response = alice_client.post("/api/sessions/", {"agent": "flight-booker", "title": "Trip"}, format="json")
    assert response.status_code == 201
    return str(response.json()["id"])


@pytest.mark.django_db
def test_create_by_slug_or_id_and_list_newest_first(
    alice_client: APIClient, alice: Any, booking_agent: Agent, chat_agent: Agent
) -> None:
    first = alice_client.post("/api/sessions/", {"agent": "flight-booker"}, format="json").json()
    second = alice_client.post("/api/sessions/", {"agent_id": chat_agent.pk, "title": "Chat"}, format="json").json()
    assert first["workflow"] == "flight_booking" and first["state"] == "IDLE" and first["agent"] == "flight-booker"
    assert second["workflow"] == "free_chat" and second["title"] == "Chat"
    assert ChatSession.objects.filter(user=alice).count() == 2
    page = alice_client.get("/api/sessions/", {"page_size": 1}).json()
    assert page["count"] == 2 and len(page["results"]) == 1 and page["next"]
    assert page["results"][0]["id"] == second["id"]


@pytest.mark.django_db
def test_create_needs_an_active_agent(alice_client: APIClient, retired_agent: Agent) -> None:
    assert (
        "agent"
        in assert_error(alice_client.post("/api/sessions/", {}, format="json"), 400, "invalid")["details"]["fields"]
    )
    # An agent that is not (or no longer) active is not found: a 404 that names the field (it was a 400, which the
    # schema could not tell from a malformed body).
    by_slug = assert_error(alice_client.post("/api/sessions/", {"agent": "retired"}, format="json"), 404, "not_found")
    assert by_slug["details"]["fields"] == {"agent": ["No active agent has the slug retired."]}
    by_id = assert_error(
        alice_client.post("/api/sessions/", {"agent_id": retired_agent.pk}, format="json"), 404, "not_found"
    )
    assert by_id["details"]["fields"] == {"agent_id": [f"No active agent has the id {retired_agent.pk}."]}


@pytest.mark.django_db
def test_post_a_message_then_read_history_state_and_checkpoints(alice_client: APIClient, session_id: str) -> None:
    response = alice_client.post(f"/api/sessions/{session_id}/messages/", {"message": "I need a flight"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["replayed"] is False
    assert body["is_demo"] is True and body["model_label"] == DEMO_LABEL
    assert body["reply"] and body["reply"] == body["turn"]["assistant_message"]
    assert body["turn"]["status"] == "completed" and body["turn"]["seq"] == 1
    assert body["session"]["id"] == session_id

    history = alice_client.get(f"/api/sessions/{session_id}/messages/").json()
    assert [t["user_message"] for t in history["results"]] == ["I need a flight"]

    state = alice_client.get(f"/api/sessions/{session_id}/state/").json()
    assert state["workflow"] == "flight_booking"
    assert state["states"][0] == "IDLE" and "COMPLETED" in state["terminal_states"]
    assert state["state"] == ChatSession.objects.get(pk=session_id).state
    assert state["state_labels"]["GATHERING_ORIGIN"] == "Where from"  # the workflow's words for its states

    checkpoints = alice_client.get(f"/api/sessions/{session_id}/checkpoints/").json()
    reasons = [c["reason"] for c in checkpoints["results"]]
    assert Checkpoint.Reason.BEFORE_CALL in reasons
    assert checkpoints["count"] == Checkpoint.objects.filter(session_id=session_id).count()
    assert [c["seq"] for c in checkpoints["results"]] == sorted(c["seq"] for c in checkpoints["results"])


@pytest.mark.django_db
def test_idempotency_key_replays_instead_of_running_twice(alice_client: APIClient, session_id: str) -> None:
    path = f"/api/sessions/{session_id}/messages/"
    first = alice_client.post(path, {"message": "From Oslo"}, format="json", HTTP_IDEMPOTENCY_KEY="key-1")
    again = alice_client.post(path, {"message": "From Oslo"}, format="json", HTTP_IDEMPOTENCY_KEY="key-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["replayed"] is True
    assert again.json()["turn"]["id"] == first.json()["turn"]["id"]
    assert again.json()["reply"] == first.json()["reply"]
    assert Turn.objects.filter(session_id=session_id).count() == 1
    other = alice_client.post(path, {"message": "From Oslo"}, format="json", HTTP_IDEMPOTENCY_KEY="key-2")
    assert other.status_code == 201 and Turn.objects.filter(session_id=session_id).count() == 2


@pytest.mark.django_db
def test_a_used_idempotency_key_with_another_message_is_refused(alice_client: APIClient, session_id: str) -> None:
    """A retry must resend its message: another message under the key would be answered with the first reply
    and never saved. Refused before and after the lock (the first turn completed, or it failed)."""
    path = f"/api/sessions/{session_id}/messages/"
    assert alice_client.post(path, {"message": "From Oslo"}, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 201
    reused = alice_client.post(path, {"message": "To Rome"}, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert_error(reused, 422, "idempotency_key_reused")
    Turn.objects.filter(session_id=session_id).update(status=Turn.Status.FAILED)
    after_failure = alice_client.post(path, {"message": "To Rome"}, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert_error(after_failure, 422, "idempotency_key_reused")
    assert list(Turn.objects.filter(session_id=session_id).values_list("user_message", flat=True)) == ["From Oslo"]
    assert not session_is_locked(session_id)  # the refusal after the lock let it go


@pytest.mark.django_db
def test_streamed_reply_arrives_as_server_sent_events(alice_client: APIClient, session_id: str) -> None:
    response = alice_client.post(
        f"/api/sessions/{session_id}/messages/stream/",
        {"message": "Hello <script>alert(1)</script> **there**"},
        format="json",
        HTTP_ACCEPT="text/event-stream",
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"] == "no-cache"
    events = _events(response)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "turn" and kinds[-1] == "done"
    assert kinds.count("delta") >= 2, "the reply should arrive in pieces"
    done = events[-1][1]
    assert "".join(data["text"] for kind, data in events if kind == "delta") == done["reply"]
    turn = Turn.objects.get(pk=done["turn_id"])
    assert turn.assistant_message == done["reply"] and turn.status == Turn.Status.COMPLETED
    assert done["is_demo"] is True
    # The HTML version is sanitized: whatever the model echoed, no script survives.
    assert "<script" not in done["html"].lower()


@pytest.mark.django_db
def test_delete_removes_the_session_and_its_turns(alice_client: APIClient, session_id: str) -> None:
    alice_client.post(f"/api/sessions/{session_id}/messages/", {"message": "hi"}, format="json")
    assert alice_client.delete(f"/api/sessions/{session_id}/").status_code == 204
    assert not ChatSession.objects.filter(pk=session_id).exists()
    assert not Turn.objects.filter(session_id=session_id).exists()
    assert_error(alice_client.get(f"/api/sessions/{session_id}/"), 404, "not_found")


@pytest.mark.django_db
def test_composition_shows_sections_and_retrieval(
    alice_client: APIClient, staff_client: APIClient, session_id: str
) -> None:
    turn_id = alice_client.post(f"/api/sessions/{session_id}/messages/", {"message": "hi"}, format="json").json()[
        "turn"
    ]["id"]
    for client in (alice_client, staff_client):
        body = client.get(f"/api/turns/{turn_id}/composition/").json()
        assert body["id"] == turn_id and body["session"] == session_id
        turn = Turn.objects.get(pk=turn_id)
        assert body["composition"] == turn.composition and body["retrieval"] == turn.retrieval
        assert body["composition"]["sections"]["system"] > 0
        assert body["prompt_tokens"] == turn.prompt_tokens > 0


@pytest.mark.django_db
def test_a_failed_turn_tells_the_user_why_without_internals(
    alice_client: APIClient, chat_agent: Agent, settings: Any
) -> None:
    """The exception's text (here the model endpoint's address) stays in ``Turn.error`` for staff; the API
    answers with what the user was told."""
    settings.LLM_PROFILES = {
        "default": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "", "max_retries": 0}
    }
    session = alice_client.post("/api/sessions/", {"agent": chat_agent.slug}, format="json").json()
    path = f"/api/sessions/{session['id']}/messages/"

    sent = alice_client.post(path, {"message": "Hello"}, format="json")
    listed = alice_client.get(path)

    turn = Turn.objects.get(session_id=session["id"])
    assert turn.status == Turn.Status.FAILED and "127.0.0.1:9" in turn.error
    for body in (sent.json()["turn"], listed.json()["results"][0]):
        assert body["status"] == "failed" and body["error"] == turn.assistant_message
        assert "Your message is saved" in body["error"]
    checkpoints = alice_client.get(f"/api/sessions/{session['id']}/checkpoints/")
    retry = [c for c in checkpoints.json()["results"] if c["reason"] == "retry"]
    assert retry and retry[0]["detail"] == "failure 1: llm_connection_error (LLMConnectionError)"
    assert "127.0.0.1" not in sent.content.decode() + listed.content.decode() + checkpoints.content.decode()


@pytest.fixture
def fake_model_session(alice_client: APIClient, chat_agent: Agent, settings: Any, fake_openai: Any) -> dict[str, Any]:
    """Alice's chat session answered by the fake OpenAI-compatible server (``fake_openai`` queues the replies)."""
    settings.LLM_PROFILES = {"default": fake_openai.profile(max_retries=0)}
    return dict(alice_client.post("/api/sessions/", {"agent": chat_agent.slug}, format="json").json())


@pytest.mark.django_db
def test_a_reply_with_nul_bytes_completes_the_turn(
    alice_client: APIClient, fake_model_session: dict[str, Any], fake_openai: Any
) -> None:
    """The model's reply had reached the user (streamed) when its save failed on the NUL: the turn failed."""
    from tests.fakes.openai_server import stream

    fake_openai.enqueue(stream("a\x00b"))
    session = fake_model_session

    sent = alice_client.post(f"/api/sessions/{session['id']}/messages/", {"message": "hi"}, format="json")

    assert sent.status_code == 201 and sent.json()["turn"]["status"] == "completed"
    assert Turn.objects.get(session_id=session["id"]).assistant_message == "a\ufffdb"


@pytest.mark.django_db
def test_a_reply_with_a_script_streams_as_text_and_arrives_sanitized(
    alice_client: APIClient, fake_model_session: dict[str, Any], fake_openai: Any
) -> None:
    from tests.fakes.openai_server import stream

    fake_openai.enqueue(stream("Hello <script>alert(1)</script> **there** <img src=x onerror=alert(2)>"))
    session = fake_model_session

    response = alice_client.post(
        f"/api/sessions/{session['id']}/messages/stream/",
        {"message": "hi"},
        format="json",
        HTTP_ACCEPT="text/event-stream",
    )

    done = _events(response)[-1][1]
    assert "<script>alert(1)</script>" in done["reply"]  # the text as the model wrote it (shown as text)
    html = done["html"].lower()
    assert "<strong>there</strong>" in html  # rendered as markdown ...
    assert active_parts(html) == []  # ... and nothing in it runs: the model's tags are shown as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.django_db
def test_a_switched_off_agents_chats_stay_readable_and_take_no_new_message(
    alice: Any, alice_client: APIClient, chat_agent: Agent
) -> None:
    """An operator switching an agent off (is_active) expects it to stop answering, not only to leave the list."""
    from django.test import Client

    session = alice_client.post("/api/sessions/", {"agent": chat_agent.slug}, format="json").json()
    url = f"/api/sessions/{session['id']}/messages/"
    assert alice_client.post(url, {"message": "hello"}, format="json").status_code == 201
    Agent.objects.filter(pk=chat_agent.pk).update(is_active=False)

    refused = alice_client.post(url, {"message": "still there?"}, format="json")
    assert_error(refused, 503, "agent_unavailable")
    web = Client()
    web.force_login(alice)
    streamed = web.post(
        f"/chats/{session['id']}/stream/", data=json.dumps({"message": "still there?"}), content_type="application/json"
    )
    assert streamed.status_code == 503 and streamed.json()["error"]["code"] == "agent_unavailable"
    assert [t["user_message"] for t in alice_client.get(url).json()["results"]] == ["hello"]
    assert web.get(f"/chats/{session['id']}/").status_code == 200
