"""Who may see what, through every API endpoint: anonymous, Alice (the owner), Bob, staff (a superuser)
and bare staff (``is_staff`` without any of the admin's permissions).

Alice owns a session (with one turn) and a memory. Bob and staff asking for them get 404, exactly as
for ids that do not exist, so ids leak nothing; the one exception is a turn's context composition,
which staff allowed to view turns in the admin may read for any turn. Bare staff are treated as Bob.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.models import Agent
from memory.models import Memory
from memory.services import memory_create
from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Turn
from sessions.services import session_create
from tests.api.conftest import assert_error, token_client
from tests.api.test_openai_door import assert_openai_error


@dataclass
class World:
    agent: Agent
    session: ChatSession
    turn: Turn
    memory: Memory


@pytest.fixture
def world(alice: Any, chat_agent: Agent) -> World:
    session = session_create(user=alice, agent=chat_agent)
    result = turn_run(session=session, message="My favourite colour is teal.")
    memory = memory_create(user=alice, kind="semantic", text="Alice prefers aisle seats on long flights.")
    return World(agent=chat_agent, session=session, turn=result.turn, memory=memory)


ANON, ALICE, BOB, STAFF, BARE_STAFF = "anonymous", "alice", "bob", "staff", "bare staff"

# (method, path template, body, {persona: expected status})
OWNER_ONLY = {ANON: 401, ALICE: 200, BOB: 404, STAFF: 404}
ANY_USER = {ANON: 401, ALICE: 200, BOB: 200, STAFF: 200}
CASES: list[tuple[str, str, dict[str, Any] | None, dict[str, int]]] = [
    ("get", "/api/me/", None, ANY_USER),
    ("get", "/api/me/export/", None, ANY_USER),
    ("get", "/api/metrics/", None, ANY_USER),
    ("get", "/api/agents/", None, ANY_USER),
    ("get", "/api/agents/{agent}/", None, ANY_USER),
    ("get", "/api/sessions/", None, ANY_USER),
    ("post", "/api/sessions/", {"agent": "chatty"}, {ANON: 401, ALICE: 201, BOB: 201, STAFF: 201}),
    ("get", "/api/sessions/{session}/", None, OWNER_ONLY),
    ("delete", "/api/sessions/{session}/", None, {ANON: 401, ALICE: 204, BOB: 404, STAFF: 404}),
    ("get", "/api/sessions/{session}/state/", None, OWNER_ONLY),
    ("get", "/api/sessions/{session}/checkpoints/", None, OWNER_ONLY),
    ("get", "/api/sessions/{session}/messages/", None, OWNER_ONLY),
    ("post", "/api/sessions/{session}/messages/", {"message": "hello"}, {ANON: 401, ALICE: 201, BOB: 404, STAFF: 404}),
    ("post", "/api/sessions/{session}/messages/stream/", {"message": "hello"}, OWNER_ONLY),
    ("post", "/api/sessions/{session}/fork/", {"turn": 1}, {ANON: 401, ALICE: 201, BOB: 404, STAFF: 404}),
    ("get", "/api/sessions/{session}/branches/", None, OWNER_ONLY),
    ("get", "/api/turns/{turn}/composition/", None, {ANON: 401, ALICE: 200, BOB: 404, STAFF: 200}),
    ("get", "/api/memories/", None, ANY_USER),
    (
        "post",
        "/api/memories/",
        {"kind": "semantic", "text": "Likes tea."},
        {ANON: 401, ALICE: 201, BOB: 201, STAFF: 201},
    ),
    ("get", "/api/memories/search/?q=aisle", None, ANY_USER),
    ("get", "/api/memories/{memory}/", None, OWNER_ONLY),
    ("patch", "/api/memories/{memory}/", {"pinned": True}, OWNER_ONLY),
    ("delete", "/api/memories/{memory}/", None, {ANON: 401, ALICE: 204, BOB: 404, STAFF: 404}),
    # Each erases their own data only: Bob's or staff's erasure leaves Alice's things as they were.
    ("post", "/api/me/erase/", {"confirm": "erase my data"}, {ANON: 401, ALICE: 200, BOB: 200, STAFF: 200}),
    # Each deletes their own account only.
    ("post", "/api/me/delete/", {"confirm": "delete my account"}, {ANON: 401, ALICE: 200, BOB: 200, STAFF: 200}),
    # The OpenAI-compatible door (errors in OpenAI's shape): a session named in it is its owner's only.
    ("get", "/v1/models", None, ANY_USER),
    ("get", "/v1/models/chatty", None, ANY_USER),
    (
        "post",
        "/v1/chat/completions",
        {
            "model": "chatty",
            "messages": [{"role": "user", "content": "hello"}],
            "metadata": {"session_id": "{session}"},
        },
        OWNER_ONLY,
    ),
    (
        "post",
        "/v1/chat/completions",
        {"model": "chatty", "messages": [{"role": "user", "content": "hello"}], "stream": True},
        {ANON: 401, ALICE: 200, BOB: 200, STAFF: 200},
    ),
]


def _client(persona: str, users: dict[str, Any]) -> APIClient:
    return APIClient() if persona == ANON else token_client(users[persona])


@pytest.fixture
def bare_staff(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="bare-staff", password="bare-pass-123", is_staff=True)


@pytest.mark.django_db
@pytest.mark.parametrize("persona", [ANON, ALICE, BOB, STAFF, BARE_STAFF])
@pytest.mark.parametrize(("method", "template", "body", "expected"), CASES, ids=[f"{c[0]} {c[1]}" for c in CASES])
def test_access_matrix(
    persona: str,
    method: str,
    template: str,
    body: dict[str, Any] | None,
    expected: dict[str, int],
    world: World,
    alice: Any,
    bob: Any,
    staff: Any,
    bare_staff: Any,
) -> None:
    path = template.format(agent=world.agent.pk, session=world.session.pk, turn=world.turn.pk, memory=world.memory.pk)
    if body is not None:
        body = json.loads(json.dumps(body).replace("{session}", str(world.session.pk)))
    client = _client(persona, {ALICE: alice, BOB: bob, STAFF: staff, BARE_STAFF: bare_staff})
    response = getattr(client, method)(path, body, format="json") if body is not None else getattr(client, method)(path)
    want = expected[BOB if persona == BARE_STAFF else persona]
    if want >= 400 and path.startswith("/v1/"):
        assert_openai_error(response, want, {401: "not_authenticated", 404: "session_not_found"}[want])
        assert Turn.objects.filter(session=world.session).count() == 1
    elif want >= 400:
        assert_error(response, want, {401: "not_authenticated", 404: "not_found"}[want])
        # Alice's things are untouched by a refused request.
        assert ChatSession.objects.filter(pk=world.session.pk).exists()
        assert Memory.objects.filter(pk=world.memory.pk, pinned=False).exists()
        assert Turn.objects.filter(session=world.session).count() == 1
    else:
        assert response.status_code == want, (response.status_code, response.content[:300])
        if template in ("/api/me/erase/", "/api/me/delete/") and persona != ALICE:
            assert ChatSession.objects.filter(pk=world.session.pk).exists()
            assert Memory.objects.filter(pk=world.memory.pk).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("persona", [BOB, STAFF])
def test_lists_never_contain_alices_things(persona: str, world: World, alice: Any, bob: Any, staff: Any) -> None:
    client = _client(persona, {ALICE: alice, BOB: bob, STAFF: staff})
    sessions = client.get("/api/sessions/").json()
    assert sessions["count"] == 0 and sessions["results"] == []
    memories = client.get("/api/memories/").json()
    assert all(m["id"] != world.memory.pk for m in memories["results"])
    found = client.get("/api/memories/search/", {"q": "aisle seats long flights"}).json()
    assert all(hit["memory"]["id"] != world.memory.pk for hit in found["items"])
    assert all(c["id"] != world.memory.pk for c in found["report"]["candidates"])
    exported = b"".join(client.get("/api/me/export/").streaming_content).decode()
    assert "teal" not in exported and "aisle" not in exported  # an export holds its owner's things only
    metrics = client.get("/api/metrics/").json()
    assert metrics["turns"]["total"] == 0 and metrics["sessions"]["total"] == 0
    # Through the OpenAI-compatible door: Alice's conversation resent is a new session of theirs, never hers.
    said = [
        {"role": "user", "content": world.turn.user_message},
        {"role": "assistant", "content": world.turn.assistant_message},
    ]
    answer = client.post(
        "/v1/chat/completions",
        {"model": "chatty", "messages": [*said, {"role": "user", "content": "What is my favourite colour?"}]},
        format="json",
    ).json()
    assert answer["session_id"] != str(world.session.pk)
    assert Turn.objects.filter(session=world.session).count() == 1


@pytest.mark.django_db
def test_alice_lists_and_finds_her_own(world: World, alice: Any) -> None:
    client = token_client(alice)
    sessions = client.get("/api/sessions/").json()
    assert [s["id"] for s in sessions["results"]] == [str(world.session.pk)]
    memories = client.get("/api/memories/").json()
    assert world.memory.pk in [m["id"] for m in memories["results"]]
    found = client.get("/api/memories/search/", {"q": "aisle seats on long flights"}).json()
    assert world.memory.pk in [hit["memory"]["id"] for hit in found["items"]]
    metrics = client.get("/api/metrics/").json()
    assert metrics["turns"]["total"] == 1 and metrics["sessions"]["total"] == 1


@pytest.mark.django_db
def test_someone_elses_id_looks_exactly_like_a_missing_one(world: World, bob: Any) -> None:
    client = token_client(bob)
    theirs = client.get(f"/api/sessions/{world.session.pk}/")
    missing = client.get("/api/sessions/00000000-0000-4000-8000-000000000000/")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json() == missing.json()
    assert client.get(f"/api/memories/{world.memory.pk}/").json() == client.get("/api/memories/999999999/").json()
