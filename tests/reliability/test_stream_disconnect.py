"""A client that goes away in the middle of a streamed reply, over a real connection to gunicorn: the turn is
answered anyway, once, and its reply saved for when the client comes back."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlparse

import pytest

from agents.models import Agent, LLMCall
from conftest import wait_for
from sessions.locks import session_is_locked
from sessions.models import Turn
from sessions.services import session_create
from tests.fakes.openai_server import stream
from tests.reliability.conftest import api_token

WORDS = 400  # enough events that writing them to a closed connection fails on the server


@pytest.mark.django_db(transaction=True)
def test_a_client_gone_mid_stream_still_gets_its_reply_saved_once(
    alice: Any, chat_agent: Agent, fake_openai: Any, web_server: Any
) -> None:
    server = web_server(llm_profile=fake_openai.profile(read_timeout=60.0, max_retries=0))
    session = session_create(user=alice, agent=chat_agent)
    reply = " ".join(f"word{i}" for i in range(WORDS))
    fake_openai.enqueue(stream(reply, hang=1.0))  # the model thinks for a second, then streams

    address = urlparse(server.url)
    body = b'{"message": "Tell me a long story."}'
    request = (
        f"POST /api/sessions/{session.pk}/messages/stream/ HTTP/1.1\r\nHost: {address.netloc}\r\n"
        f"Authorization: Token {api_token(alice)}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with socket.create_connection((address.hostname, address.port), timeout=30) as client:
        client.sendall(request)
        first = client.recv(4096)
        assert b"200 OK" in first  # the stream has begun: headers and the opening comment
        # The client goes away with the model still thinking: a reset, as a closed tab gives.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    turn = Turn.objects.get(session=session)
    wait_for(lambda: Turn.objects.get(pk=turn.pk).status != Turn.Status.RUNNING, timeout=60, message="the turn")
    turn.refresh_from_db()
    assert (turn.status, turn.assistant_message) == (Turn.Status.COMPLETED, reply)
    # One model call, finished: not abandoned and asked again by the next message or the sweep.
    assert list(LLMCall.objects.filter(turn=turn).values_list("purpose", "outcome")) == [("reply", "ok")]
    assert len(fake_openai.chat_requests()) == 1
    wait_for(lambda: not session_is_locked(session.pk), timeout=30, message="the session's lock to go")
    assert "could not finish" not in server.log_text()
