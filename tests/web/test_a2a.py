"""A2A 1.0 with the official ``a2a-sdk`` client against the app as ``make run`` serves it (gunicorn with uvicorn
workers): the agent card discovered, a message, a streamed message in the same context (one session), the task read
back, a cancel refused; another person's task is not found and their context out of reach; no token, a 401; an
old protocol version, refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError
from google.protobuf.struct_pb2 import Struct
from rest_framework.authtoken.models import Token

from sessions.models import ChatSession, Turn
from tests.reliability.conftest import ServerProcess, server_env
from tests.world import make_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def app_url(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    env = {**server_env(tmp_path), **getattr(request, "param", {})}
    server = ServerProcess(env=env, log_dir=tmp_path, asgi=True).start()
    yield server.url
    server.stop()


def _key(user: Any) -> str:
    return str(Token.objects.get_or_create(user=user)[0].key)


def _message(text: str, *, agent: str = "", context_id: str = "", n: int = 1) -> SendMessageRequest:
    metadata = Struct()
    if agent:
        metadata.update({"agent": agent})
    return SendMessageRequest(
        message=Message(
            message_id=f"m-{n}", role=Role.ROLE_USER, parts=[Part(text=text)], context_id=context_id, metadata=metadata
        )
    )


async def _session(url: str, key: str, calls: Any, *, streaming: bool) -> Any:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        client = await create_client(url, client_config=ClientConfig(httpx_client=http, streaming=streaming))
        return await calls(client)


def test_a2a_card_message_stream_task_and_cancel_with_the_sdk_client(app_url: str, alice: Any, bob: Any) -> None:
    make_agent("chat")
    alice_key, bob_key = _key(alice), _key(bob)

    async def whole(client: Any) -> Any:
        # The client was made from the card it discovered: its JSON-RPC interface, at /a2a/.
        events = [event async for event in client.send_message(_message("My dog is called Rex.", agent="chat"))]
        return events

    events = asyncio.run(_session(app_url, alice_key, whole, streaming=False))
    task = events[-1].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    reply = task.artifacts[0].parts[0].text
    assert reply and task.history[0].parts[0].text == "My dog is called Rex."
    session = ChatSession.objects.get(user=alice)
    assert task.context_id == str(session.pk) and task.id == str(Turn.objects.get(session=session).pk)

    async def streamed(client: Any) -> Any:
        events = [
            e async for e in client.send_message(_message("What is my dog called?", context_id=task.context_id, n=2))
        ]
        read = await client.get_task(GetTaskRequest(id=task.id))
        try:
            await client.cancel_task(CancelTaskRequest(id=task.id))
        except TaskNotCancelableError as exc:
            cancel: Any = exc
        else:
            cancel = None
        return events, read, cancel

    events, read, cancel = asyncio.run(_session(app_url, alice_key, streamed, streaming=True))
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task" and "artifact_update" in kinds and kinds[-1] == "status_update", kinds
    text = "".join(e.artifact_update.artifact.parts[0].text for e in events if e.HasField("artifact_update"))
    assert "Rex" in text
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert ChatSession.objects.filter(user=alice).count() == 1 and Turn.objects.filter(session=session).count() == 2
    assert read.id == task.id and read.artifacts[0].parts[0].text == reply
    assert isinstance(cancel, TaskNotCancelableError)

    async def as_bob(client: Any) -> list[Any]:
        caught = []
        for call in (
            client.get_task(GetTaskRequest(id=task.id)),
            client.cancel_task(CancelTaskRequest(id=task.id)),
        ):
            try:
                await call
            except Exception as exc:  # noqa: BLE001 - the error itself is the answer
                caught.append(exc)
        try:
            [e async for e in client.send_message(_message("What is the dog called?", context_id=task.context_id))]
        except Exception as exc:  # noqa: BLE001
            caught.append(exc)
        return caught

    caught = asyncio.run(_session(app_url, bob_key, as_bob, streaming=False))
    assert [type(e) for e in caught] == [TaskNotFoundError, TaskNotFoundError, InvalidParamsError], caught
    assert Turn.objects.filter(session=session).count() == 2 and not ChatSession.objects.filter(user=bob).exists()


def test_a2a_refuses_a_stranger_and_an_old_protocol(app_url: str, alice: Any) -> None:
    make_agent("chat")
    card = httpx.get(f"{app_url}/.well-known/agent-card.json", timeout=30).json()
    assert [s["id"] for s in card["skills"]] == ["chat"]
    assert card["supportedInterfaces"][0]["url"].endswith("/a2a/")
    assert "bearer" in card["securitySchemes"]
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "1"}}
    assert httpx.post(f"{app_url}/a2a/", json=body, timeout=30).status_code == 401
    old = httpx.post(f"{app_url}/a2a/", json=body, headers={"Authorization": f"Bearer {_key(alice)}"}, timeout=30)
    assert old.status_code == 200 and "error" in old.json(), old.text  # no A2A-Version header: 0.3, not served
    new = httpx.post(
        f"{app_url}/a2a/",
        json=body,
        headers={"Authorization": f"Bearer {_key(alice)}", "A2A-Version": "1.0"},
        timeout=30,
    )
    assert "version" in old.json()["error"]["message"].lower(), old.json()
    assert new.json()["error"]["data"][0]["reason"] == "TASK_NOT_FOUND", new.json()  # 1.0 is served: no such task


def test_hostile_a2a_requests_are_clear_errors_and_save_nothing(app_url: str, alice: Any) -> None:
    """The hostile-input rules of every door (tests/reliability/test_hostile_input.py) at /a2a/."""
    make_agent("chat")
    headers = {"Authorization": f"Bearer {_key(alice)}", "A2A-Version": "1.0", "Content-Type": "application/json"}

    def send(text: Any, **metadata: Any) -> dict[str, Any]:
        message = {
            "messageId": "m",
            "role": "ROLE_USER",
            "parts": [{"text": text}],
            "metadata": {"agent": "chat", **metadata},
        }
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
        return dict(httpx.post(f"{app_url}/a2a/", json=body, headers=headers, timeout=30).json())

    for answer in (
        send("a\x00b"),
        send("x" * 40_000),
        send("   "),
        send("hi", agent="no\x00such"),
        send("hi", agent="nope"),
    ):
        assert "error" in answer and answer["error"]["message"], answer
    huge = httpx.post(f"{app_url}/a2a/", content=b"x" * 10_000_000, headers=headers, timeout=60)
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "payload_too_large"
    broken = httpx.post(
        f"{app_url}/a2a/", content=b'{"jsonrpc": "2.0", "id": 1, "method": "Send', headers=headers, timeout=30
    )
    assert broken.status_code in (200, 400) and "error" in broken.json()
    assert not Turn.objects.exists() and not ChatSession.objects.exists()


@pytest.mark.parametrize("app_url", [{"API_THROTTLE_MESSAGES": "2/min"}], indirect=True)
def test_a2a_messages_share_the_rate_of_every_door(app_url: str, alice: Any) -> None:
    make_agent("chat")
    headers = {"Authorization": f"Bearer {_key(alice)}", "A2A-Version": "1.0"}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}], "metadata": {"agent": "chat"}}
        },
    }
    answers = [httpx.post(f"{app_url}/a2a/", json=body, headers=headers, timeout=30).json() for _ in range(3)]
    assert ["result" in a for a in answers] == [True, True, False], answers
    assert "Too many messages" in answers[2]["error"]["message"]
    assert Turn.objects.count() == 2
