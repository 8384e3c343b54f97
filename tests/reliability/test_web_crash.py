"""The web process killed (SIGKILL to gunicorn's whole process group) while a model call is in flight,
through the real HTTP API: a new server resumes the turn from its checkpoint, the first message is
answered exactly once, and the session's state stays consistent."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from agents.models import Agent
from conftest import wait_for
from sessions.locks import session_is_locked
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import session_create
from tests.fakes.openai_server import hang, stream
from tests.reliability.conftest import api_token


@pytest.mark.django_db(transaction=True)
def test_a_killed_web_process_is_resumed_by_the_next_server_exactly_once(
    alice: Any, chat_agent: Agent, fake_openai: Any, web_server: Any
) -> None:
    server = web_server(llm_profile=fake_openai.profile(read_timeout=60.0, max_retries=0))
    session = session_create(user=alice, agent=chat_agent)
    url = f"{server.url}/api/sessions/{session.pk}/messages/"
    auth = {"Authorization": f"Token {api_token(alice)}"}
    first = {**auth, "Idempotency-Key": "first-message"}

    fake_openai.enqueue(hang(60))
    outcome: list[BaseException | httpx.Response] = []

    def post_first() -> None:
        try:
            outcome.append(httpx.post(url, json={"message": "I fly from Lisbon."}, headers=first, timeout=60))
        except httpx.TransportError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=post_first)
    thread.start()
    wait_for(lambda: fake_openai.chat_requests(), timeout=30, message="the model call")
    turn = Turn.objects.get(session=session)
    assert turn.status == Turn.Status.RUNNING
    assert Checkpoint.objects.filter(turn=turn, reason=Checkpoint.Reason.BEFORE_CALL).exists()

    server.kill()
    thread.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.TransportError)  # the client saw the crash
    wait_for(lambda: not session_is_locked(session.pk), timeout=30, message="the dead server's lock to go")

    server.start()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        # The client retries with the same key: the saved turn is finished, not started again.
        fake_openai.enqueue(stream("Noted: Lisbon."))
        retried = client.post(url, json={"message": "I fly from Lisbon."}, headers=first)
        assert retried.status_code == 201, retried.text[:2000]
        assert (retried.json()["turn"]["id"], retried.json()["reply"]) == (turn.pk, "Noted: Lisbon.")

        fake_openai.enqueue(stream("Lisbon, yes."))
        second = client.post(url, json={"message": "Where do I fly from?"}, headers=auth)
        assert second.status_code == 201, second.text[:2000]

        # Asking again with the first key replays the saved answer: no model call, no new turn.
        calls = len(fake_openai.chat_requests())
        replay = client.post(url, json={"message": "I fly from Lisbon."}, headers=first)
        assert replay.status_code == 200 and replay.json()["replayed"] is True
        assert replay.json()["reply"] == "Noted: Lisbon."
        assert len(fake_openai.chat_requests()) == calls

    turns = list(Turn.objects.filter(session=session).order_by("seq").values_list("seq", "status", "assistant_message"))
    assert turns == [(1, "completed", "Noted: Lisbon."), (2, "completed", "Lisbon, yes.")]
    session = ChatSession.objects.get(pk=session.pk)
    assert (session.status, session.state, session.retry_count) == ("active", "CHATTING", 0)
    seqs = list(Checkpoint.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))  # the checkpoint log has no gap and no duplicate
