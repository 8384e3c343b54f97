"""Many requests at once against a real gunicorn server (2 processes × 10 threads) on the demo model:
20 concurrent messages on one session are serialised by the per-session lock — 20 turns, seqs 1..20,
each message answered exactly once — and 50 sessions in parallel all complete their turns."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from agents.models import Agent
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import session_create
from tests.reliability.conftest import api_token

pytestmark = pytest.mark.django_db(transaction=True)


def _post_all(server: Any, jobs: list[tuple[str, str]], token: str, *, workers: int) -> list[httpx.Response]:
    headers = {"Authorization": f"Token {token}"}
    limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
    with httpx.Client(base_url=server.url, timeout=180, limits=limits) as client:

        def post(job: tuple[str, str]) -> httpx.Response:
            session_id, message = job
            return client.post(f"/api/sessions/{session_id}/messages/", json={"message": message}, headers=headers)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(post, jobs))


def _assert_consistent(session: ChatSession, messages: list[str]) -> None:
    turns = list(Turn.objects.filter(session=session).order_by("seq"))
    assert [t.seq for t in turns] == list(range(1, len(messages) + 1))
    assert sorted(t.user_message for t in turns) == sorted(messages)  # none lost, none duplicated
    assert all(t.status == Turn.Status.COMPLETED and t.assistant_message for t in turns)
    # Serialised: each turn started after the previous one completed.
    for earlier, later in zip(turns, turns[1:], strict=False):
        assert earlier.completed_at is not None and later.started_at is not None
        assert earlier.completed_at <= later.started_at
    seqs = list(Checkpoint.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    session.refresh_from_db()
    assert (session.status, session.retry_count) == ("active", 0)


def test_twenty_concurrent_messages_on_one_session_are_serialised(
    alice: Any, chat_agent: Agent, web_server: Any
) -> None:
    server = web_server(workers=2, threads=10)
    session = session_create(user=alice, agent=chat_agent)
    messages = [f"Message number {i}: tell me something about the number {i}." for i in range(20)]
    responses = _post_all(server, [(str(session.pk), m) for m in messages], api_token(alice), workers=20)
    assert [r.status_code for r in responses] == [201] * 20, [r.text[:300] for r in responses if r.status_code != 201]
    assert sorted(r.json()["turn"]["seq"] for r in responses) == list(range(1, 21))
    for message, response in zip(messages, responses, strict=True):
        assert response.json()["turn"]["user_message"] == message
    _assert_consistent(session, messages)


@pytest.mark.parametrize(
    "turns_each", [1, pytest.param(3, marks=pytest.mark.slow)], ids=["one-turn-each", "three-turns-each"]
)
def test_fifty_sessions_in_parallel_all_complete(
    turns_each: int, alice: Any, bob: Any, chat_agent: Agent, web_server: Any
) -> None:
    server = web_server(workers=2, threads=10)
    sessions = [session_create(user=alice if i % 2 else bob, agent=chat_agent) for i in range(50)]
    messages = {s.pk: [f"Session {n}, turn {t}: hello." for t in range(turns_each)] for n, s in enumerate(sessions)}
    for user in (alice, bob):
        owned = [s for s in sessions if s.user_id == user.pk]
        jobs = [(str(s.pk), m) for t in range(turns_each) for s in owned for m in [messages[s.pk][t]]]
        responses = _post_all(server, jobs, api_token(user), workers=25)
        assert all(r.status_code == 201 for r in responses), [r.text[:300] for r in responses if r.status_code != 201]
    for session in sessions:
        _assert_consistent(session, messages[session.pk])
