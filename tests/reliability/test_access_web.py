"""The access matrix beyond /api/ (tests/api/test_access_matrix.py covers every API endpoint): the web
chat, the staff dashboard, /metrics, the admin and the health check, for anonymous, Alice (the owner),
Bob and staff. Someone else's chat is a 404, exactly like a missing one (staff with the view permissions read the
chat's page, read-only)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from agents.models import Agent
from memory.services import memory_create
from orchestrator.runtime import turn_run
from sessions.services import session_create

ANON, ALICE, BOB, STAFF = "anonymous", "alice", "bob", "staff"
LOGIN = 302  # a redirect to the sign-in page
STAFF_ONLY = {ANON: LOGIN, ALICE: 403, BOB: 403, STAFF: 200}
ADMIN = {ANON: LOGIN, ALICE: LOGIN, BOB: LOGIN, STAFF: 200}
OWNER = {ANON: LOGIN, ALICE: 200, BOB: 404, STAFF: 404}
# The chat page's own requests: signed out, a JSON 401 its script acts on (not a redirect fetch would follow).
OWNER_XHR = {ANON: 401, ALICE: 200, BOB: 404, STAFF: 404}
SIGNED_IN = {ANON: LOGIN, ALICE: 200, BOB: 200, STAFF: 200}
CASES = [
    ("/", SIGNED_IN),
    # Staff who may read sessions, turns and memories read a person's chat page, read-only (issue 55).
    ("/chats/{session}/", {**OWNER, STAFF: 200}),
    ("/chats/{session}/panels/", OWNER_XHR),
    ("/chats/{session}/events/", OWNER_XHR),
    ("/ops/", STAFF_ONLY),
    ("/ops/sessions/{session}/", STAFF_ONLY),
    ("/admin/", ADMIN),
    ("/admin/memory/memory/", ADMIN),
    ("/admin/memory/memory/{memory}/change/", ADMIN),
    ("/admin/chat_sessions/chatsession/{session}/change/", ADMIN),
    ("/admin/chat_sessions/turn/{turn}/change/", ADMIN),
    ("/admin/agents/llmcall/", ADMIN),
]


@pytest.fixture
def world(alice: Any, chat_agent: Agent, settings: Any) -> dict[str, Any]:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    session = session_create(user=alice, agent=chat_agent)
    turn = turn_run(session=session, message="My favourite colour is teal.").turn
    memory = memory_create(user=alice, kind="semantic", text="Alice prefers aisle seats.")
    return {"session": session.pk, "turn": turn.pk, "memory": memory.pk}


@pytest.mark.django_db
@pytest.mark.parametrize("persona", [ANON, ALICE, BOB, STAFF])
def test_web_access_matrix(persona: str, world: dict[str, Any], alice: Any, bob: Any, staff: Any) -> None:
    client = Client()
    if persona != ANON:
        client.force_login({ALICE: alice, BOB: bob, STAFF: staff}[persona])
    seen = {template: client.get(template.format(**world)) for template, _ in CASES}
    assert {t: r.status_code for t, r in seen.items()} == {t: expected[persona] for t, expected in CASES}
    for template, expected in CASES:
        response = seen[template]
        if expected[persona] == LOGIN:
            assert "login" in response["Location"], template
        if expected[persona] != 200:
            body = response.content.decode(errors="replace")
            assert "teal" not in body and "aisle" not in body, template  # nothing of Alice's leaks


@pytest.mark.django_db
def test_someone_elses_chat_looks_exactly_like_a_missing_one(world: dict[str, Any], bob: Any) -> None:
    client = Client()
    client.force_login(bob)
    theirs = client.get(f"/chats/{world['session']}/")
    missing = client.get("/chats/00000000-0000-4000-8000-000000000000/")
    assert theirs.status_code == missing.status_code == 404


@pytest.mark.django_db
def test_metrics_need_the_token_from_outside_the_machine(world: dict[str, Any], settings: Any) -> None:
    assert Client().get("/metrics").status_code == 200  # loopback (the test client's address), no token set
    outside = Client(REMOTE_ADDR="203.0.113.9")
    assert outside.get("/metrics").status_code == 401
    settings.METRICS_TOKEN = "s3cret-token"
    assert outside.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = outside.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert ok.status_code == 200
    assert "teal" not in ok.content.decode()  # figures only, never conversation text


@pytest.mark.django_db
def test_health_check_is_public_and_says_nothing_private(world: dict[str, Any]) -> None:
    response = Client().get("/healthz")
    assert response.status_code == 503  # no worker heartbeat in this test
    body = response.json()
    assert set(body) == {"status", "down", "database", "broker", "embedder", "worker", "turn_worker"}, body
    assert body["down"] == ["worker"]
    assert "teal" not in response.content.decode()


@pytest.mark.django_db
def test_a_chunked_body_is_refused_with_411_not_read_as_empty(world: dict[str, Any], alice: Any) -> None:
    client = Client()
    client.force_login(alice)
    api = client.post(
        f"/api/sessions/{world['session']}/messages/",
        data=b'{"message": "hi"}',
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="chunked",
    )
    assert api.status_code == 411 and api.json()["error"]["code"] == "length_required"
    page = client.post(
        f"/chats/{world['session']}/stream/",
        data=b'{"message": "hi"}',
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="chunked",
    )
    assert page.status_code == 411 and "Content-Length" in page.content.decode()


def test_a_chunked_body_sent_to_the_real_server_is_refused_with_411(web_server: Any) -> None:
    import socket
    from urllib.parse import urlparse

    server = web_server()
    address = urlparse(server.url)
    body = b'{"message": "hi"}'
    request = (
        (
            f"POST /api/sessions/00000000-0000-4000-8000-000000000000/messages/ HTTP/1.1\r\nHost: {address.netloc}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        ).encode()
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
    )
    with socket.create_connection((address.hostname, address.port), timeout=30) as client:
        client.sendall(request)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 411"), answer[:500]
    assert b"length_required" in payload
