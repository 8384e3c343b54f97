"""The official ``openai`` SDK (sync and async, streamed and whole) against a live server of the app as ``make run``
serves it (gunicorn with uvicorn workers, ``config.asgi``), with a real Celery worker writing memories: a fact told
in one conversation is recalled in a new one for the same person and never for another; the booking agent books a
flight with a client that resends the whole history, as chat UIs do; another person's token never reaches the
first's sessions; bad input gets OpenAI-shaped 4xx errors, which the SDK raises as its own exceptions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from rest_framework.authtoken.models import Token

from conftest import _BROKERS, wait_for
from examples.booking.models import Booking
from memory.models import Memory
from sessions.models import ChatSession, Turn
from tests.orchestrator.test_runtime import booking_script
from tests.reliability.conftest import ServerProcess, server_env
from tests.world import make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def app_url(tmp_path: Path, celery_worker: Any) -> Iterator[str]:
    """The app under gunicorn's uvicorn workers, its tasks (memory writes) sent to the test's Celery worker."""
    env = server_env(tmp_path)
    env.update({"CELERY_BROKER_URL": celery_worker.broker_url, "CELERY_QUEUE": celery_worker.queue})
    if celery_worker.transport == "filesystem":
        folder = Path(_BROKERS["worker"]["broker_transport_options"]["data_folder_in"]).parent
        env["CELERY_FILESYSTEM_BROKER_DIR"] = str(folder)
    server = ServerProcess(env=env, log_dir=tmp_path, asgi=True).start()
    yield server.url
    server.stop()


def _key(user: Any) -> str:
    return str(Token.objects.get_or_create(user=user)[0].key)


def _sync(url: str, user: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=_key(user), max_retries=0, timeout=60)


def _async(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def _memories_written(user: Any, worker: Any) -> None:
    turns = Turn.objects.filter(session__user=user, status=Turn.Status.COMPLETED)
    wait_for(
        lambda: not turns.filter(memories_written_at__isnull=True).exists(),
        timeout=60,
        message=f"the memory writes; worker log:\n{worker.log_text()[-4000:]}",
    )


def test_a_fact_told_in_one_conversation_is_recalled_in_a_new_one_and_never_for_another_user(
    app_url: str, alice: Any, bob: Any, celery_worker: Any
) -> None:
    make_agent("chat")
    told = _sync(app_url, alice).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "My favourite city is Lisbon."}]
    )
    assert told.object == "chat.completion" and told.choices[0].finish_reason == "stop"
    assert told.usage is not None and told.usage.total_tokens > 0
    _memories_written(alice, celery_worker)
    assert Memory.objects.filter(user=alice, text__icontains="Lisbon").exists()

    async def ask(key: str) -> tuple[str, Any]:
        client = _async(app_url, key)  # a key: the ORM is not for the event loop
        stream = await client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "Which city is my favourite?"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text, chunks = "", []
        async for chunk in stream:
            chunks.append(chunk)
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        await client.close()
        return text, chunks

    recalled, chunks = asyncio.run(ask(_key(alice)))
    assert "Lisbon" in recalled, recalled
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    # A new conversation: a second session, which found the fact in memory, not in its own turns.
    assert ChatSession.objects.filter(user=alice).count() == 2

    not_bobs, _ = asyncio.run(ask(_key(bob)))
    assert "Lisbon" not in not_bobs, not_bobs
    whole = asyncio.run(_whole_async(app_url, _key(bob), "Tell me my favourite city."))
    assert "Lisbon" not in whole


async def _whole_async(url: str, key: str, text: str) -> str:
    client = _async(url, key)
    answer = await client.chat.completions.create(model="chat", messages=[{"role": "user", "content": text}])
    await client.close()
    return answer.choices[0].message.content or ""


def test_the_booking_agent_books_a_flight_for_a_client_that_resends_the_history(
    app_url: str, alice: Any, bob: Any
) -> None:
    make_agent("booking")
    client = _sync(app_url, alice)
    depart = date.today() + timedelta(days=100)
    messages: list[dict[str, str]] = []
    for said in booking_script(depart):
        messages.append({"role": "user", "content": said})
        stream = client.chat.completions.create(model="booking", messages=messages, stream=True)  # type: ignore[arg-type]
        reply = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        messages.append({"role": "assistant", "content": reply})
    session = ChatSession.objects.get(user=alice)  # one conversation, one session
    assert session.state == "COMPLETED"
    booking = Booking.objects.get(session=session)
    assert (booking.origin, booking.destination, booking.passengers, booking.depart_date) == (
        "London",
        "Paris",
        2,
        depart,
    )
    assert booking.reference in messages[-1]["content"]
    assert Turn.objects.filter(session=session).count() == len(booking_script(depart))  # nothing stored twice

    # Bob's token never reaches Alice's session: named, it is not found; her history resent is a session of his.
    bobs = _sync(app_url, bob)
    with pytest.raises(openai.NotFoundError) as named:
        bobs.chat.completions.create(
            model="booking",
            messages=[{"role": "user", "content": "Cancel it"}],
            extra_headers={"X-Session-Id": str(session.pk)},
        )
    assert named.value.code == "session_not_found"
    bobs.chat.completions.create(
        model="booking", messages=[*messages, {"role": "user", "content": "What is my reference?"}]
    )  # type: ignore[list-item]
    assert Turn.objects.filter(session=session).count() == len(booking_script(depart))
    assert not Booking.objects.filter(user=bob).exists()
    assert booking.reference not in "".join(
        Turn.objects.filter(session__user=bob).values_list("assistant_message", flat=True)[len(messages) // 2 :]
    )


def test_bad_input_is_an_openai_error_the_sdk_raises(app_url: str, alice: Any) -> None:
    make_agent("chat")
    client = _sync(app_url, alice)
    assert [m.id for m in client.models.list()] == ["chat"]
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.code == "model_not_found" and unknown.value.param == "model"
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model="chat", messages=[])
    assert empty.value.code == "empty_messages"
    with pytest.raises(openai.BadRequestError) as role:
        client.chat.completions.create(
            model="chat", messages=[{"role": "tool", "content": "42", "tool_call_id": "call_1"}]
        )
    assert role.value.code == "invalid_role" and role.value.param == "messages[0].role"
    with pytest.raises(openai.APIStatusError) as huge:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x" * 10_000_000}])
    assert huge.value.status_code == 413 and huge.value.code == "payload_too_large"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{app_url}/v1", api_key="not-a-token", max_retries=0).models.list()
    raw = httpx.post(
        f"{app_url}/v1/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {_key(alice)}", "Content-Type": "application/json"},
    )
    assert raw.status_code == 400 and set(json.loads(raw.content)["error"]) == {"message", "type", "param", "code"}
    assert not Turn.objects.exists()
