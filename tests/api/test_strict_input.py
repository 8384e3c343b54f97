"""Input is what the schema says it is, or a 400 naming the parameter: booleans are JSON booleans, numbers JSON
numbers, query booleans ``true``/``false``, pages whole numbers (issue 55: schemathesis's findings, each once)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.models import Agent
from sessions.models import Turn
from sessions.services import session_create
from tests.api.conftest import assert_error


@pytest.mark.django_db
@pytest.mark.parametrize(
    "field, value", [("pinned", 0), ("pinned", 1), ("pinned", "true"), ("importance", False), ("importance", "0.5")]
)
def test_a_memory_takes_json_booleans_and_numbers_only(alice_client: APIClient, field: str, value: Any) -> None:
    body = {"kind": "semantic", "text": "Likes tea.", field: value}
    error = assert_error(alice_client.post("/api/memories/", body, format="json"), 400, "invalid")
    assert field in error["details"]["fields"]
    memory = alice_client.post("/api/memories/", {"kind": "semantic", "text": "Likes tea."}, format="json").json()
    for name, bad in ((field, value), ("archived", 0), ("archived", "false")):
        patched = alice_client.patch(f"/api/memories/{memory['id']}/", {name: bad}, format="json")
        assert name in assert_error(patched, 400, "invalid")["details"]["fields"]
    assert alice_client.patch(f"/api/memories/{memory['id']}/", {"pinned": True}, format="json").json()["pinned"]


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["archived=null", "archived=1", "archived=", "kind=", "kind=facts"])
def test_the_memory_list_refuses_what_is_not_its_parameters(alice_client: APIClient, query: str) -> None:
    error = assert_error(alice_client.get(f"/api/memories/?{query}"), 400, "invalid")
    assert query.split("=")[0] in error["details"]["fields"]


@pytest.mark.django_db
def test_the_memory_list_takes_true_and_false(alice_client: APIClient) -> None:
    memory = alice_client.post("/api/memories/", {"kind": "semantic", "text": "Likes tea."}, format="json").json()
    alice_client.patch(f"/api/memories/{memory['id']}/", {"archived": True}, format="json")
    assert alice_client.get("/api/memories/?archived=true").json()["count"] == 1
    assert alice_client.get("/api/memories/?archived=false&kind=semantic").json()["count"] == 0


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["page=", "page=0", "page=last", "page=-1", "page=1.0", "page_size=", "page_size=0"])
def test_a_page_is_a_whole_number_one_or_more(alice_client: APIClient, query: str) -> None:
    error = assert_error(alice_client.get(f"/api/sessions/?{query}"), 400, "invalid")
    assert query.split("=")[0] in error["details"]["fields"]


@pytest.mark.django_db
def test_any_page_size_the_schema_allows_is_taken(alice_client: APIClient, chat_agent: Agent) -> None:
    alice_client.post("/api/sessions/", {"agent": chat_agent.slug}, format="json")
    for size in ("1", "200", "201", "9" * 40):
        assert alice_client.get(f"/api/sessions/?page_size={size}").json()["count"] == 1, size
    assert_error(alice_client.get(f"/api/sessions/?page={'9' * 40}"), 404, "not_found")


@pytest.mark.django_db
def test_a_turns_events_without_a_reachable_channel_end_from_what_is_saved(
    alice: Any, alice_client: APIClient, chat_agent: Agent, settings: Any
) -> None:
    """The run channel down (here: its socket is not there) was a 500 for a finished turn's events."""
    settings.RUN_EVENTS_URL = "unix:///nonexistent/valkey.sock"
    session = session_create(user=alice, agent=chat_agent)
    turn = Turn.objects.create(session=session, seq=1, user_message="Hi", assistant_message="Hello", status="completed")
    response = alice_client.get(f"/api/turns/{turn.pk}/events/")
    assert response.status_code == 200
    body = b"".join(response.streaming_content).decode()
    assert "event: done" in body and '"reply": "Hello"' in body
