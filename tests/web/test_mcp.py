"""The MCP server over real streamable HTTP, with the SDK's own client: one user's memories and agents;
another user's ids are not found; bad arguments are a clear tool error that writes nothing; a token revoked
mid-session stops working at once."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from django.utils import timezone
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from rest_framework.authtoken.models import Token

from memory.models import Memory
from memory.selectors import memories_in_force
from memory.services import memory_create
from sessions.models import ChatSession, Turn
from tests.reliability.conftest import server_env
from tests.world import make_agent

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def mcp_url(tmp_path: Path) -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = (tmp_path / "mcp.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "mcp", "--http", "--port", str(port)],
        cwd=ROOT,
        env=server_env(tmp_path),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/mcp/"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.post(url, json={}, timeout=2)
            break
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the MCP server did not start:\n{(tmp_path / 'mcp.log').read_text()[-3000:]}")
            time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def _run(url: str, token: str, calls: Any) -> Any:
    async def main() -> Any:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                return await calls(client)

    return asyncio.run(main())


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def test_one_users_memory_and_agents_over_mcp(mcp_url: str, alice: Any, bob: Any) -> None:
    make_agent("chat")
    alice_token = Token.objects.create(user=alice).key
    bob_token = Token.objects.create(user=bob).key
    secret = memory_create(user=bob, kind="semantic", text="Bob keeps a secret about opera.")

    async def as_alice(client: Client) -> dict[str, Any]:
        names = {tool.name for tool in (await client.list_tools()).tools}
        added = await client.call_tool("add_memory", {"text": "Alice is allergic to peanuts.", "fact_key": "allergy"})
        found = await client.call_tool("search_memory", {"query": "peanut allergy"})
        agents = await client.call_tool("list_agents", {})
        sent = await client.call_tool("send_message", {"message": "Hello there", "agent": "chat"})
        bad = await client.call_tool("add_memory", {"text": ""})
        others = await client.call_tool("forget_memory", {"memory_id": secret.pk})
        return {
            "names": names,
            "added": added,
            "found": found,
            "agents": agents,
            "sent": sent,
            "bad": bad,
            "others": others,
        }

    seen = _run(mcp_url, alice_token, as_alice)
    assert {
        "search_memory",
        "add_memory",
        "list_memories",
        "forget_memory",
        "list_agents",
        "send_message",
        "session_state",
    } <= seen["names"]
    assert not seen["added"].is_error
    assert "allergic to peanuts" in _text(seen["found"])
    assert "chat" in _text(seen["agents"])
    assert not seen["sent"].is_error and '"reply"' in _text(seen["sent"])
    session = ChatSession.objects.get(user=alice)
    assert Turn.objects.filter(session=session, user_message="Hello there", status="completed").exists()
    assert seen["bad"].is_error and "1 to 20,000 characters" in _text(seen["bad"])
    assert Memory.objects.filter(user=alice).count() == 1  # the bad call wrote nothing
    assert seen["others"].is_error and f"no memory {secret.pk}" in _text(seen["others"])
    assert Memory.objects.filter(pk=secret.pk).exists()

    async def as_bob(client: Client) -> dict[str, Any]:
        found = await client.call_tool("search_memory", {"query": "peanut allergy"})
        state = await client.call_tool("session_state", {"session_id": str(session.pk)})
        listed = await client.call_tool("list_memories", {})
        return {"found": found, "state": state, "listed": listed}

    bobs = _run(mcp_url, bob_token, as_bob)
    assert "peanuts" not in _text(bobs["found"]) and "peanuts" not in _text(bobs["listed"])
    assert bobs["state"].is_error and "no session" in _text(bobs["state"])  # Alice's session: not found


def test_a_token_revoked_mid_session_stops_working(mcp_url: str, alice: Any) -> None:
    token = Token.objects.create(user=alice)

    async def calls(client: Client) -> Any:
        first = await client.call_tool("list_memories", {})
        await asyncio.to_thread(lambda: Token.objects.filter(pk=token.pk).delete())
        try:
            second = await client.call_tool("list_memories", {})
        except Exception as exc:  # noqa: BLE001 - the transport refuses: that is the point
            return first, exc
        return first, second

    first, second = _run(mcp_url, token.key, calls)
    assert not first.is_error
    assert isinstance(second, Exception) or second.is_error


def test_no_token_no_access(mcp_url: str) -> None:
    response = httpx.post(mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=10)
    assert response.status_code == 401 and response.json()["error"]["code"] == "not_authenticated"


def test_over_stdio_as_one_user(alice: Any, tmp_path: Path) -> None:
    from mcp import StdioServerParameters

    memory_create(user=alice, kind="semantic", text="Alice likes green tea.")
    params = StdioServerParameters(
        command=sys.executable, args=["manage.py", "mcp", "--user", "alice"], env=server_env(tmp_path), cwd=str(ROOT)
    )

    async def main() -> Any:
        async with Client(params) as client:
            return await client.call_tool("list_memories", {})

    listed = asyncio.run(main())
    assert not listed.is_error and "green tea" in _text(listed)


def _in_process(user: Any, calls: Any) -> Any:
    """The server in this process (the SDK's in-memory transport), acting for ``user`` as a stdio one does."""
    from web.mcp_server import STDIO_USER, build_server

    async def main() -> Any:
        STDIO_USER.set(user)
        async with Client(build_server()) as client:
            return await calls(client)

    return asyncio.run(main())


def test_send_message_refuses_idempotency_keys_the_rest_api_refuses(alice: Any) -> None:
    make_agent("chat")
    prefix = "k" * 200

    async def calls(client: Client) -> dict[str, Any]:
        return {
            "long": await client.call_tool(
                "send_message", {"message": "Hi", "agent": "chat", "idempotency_key": prefix + "a"}
            ),
            "control": await client.call_tool(
                "send_message", {"message": "Hi", "agent": "chat", "idempotency_key": "a\nb"}
            ),
            "first": await client.call_tool(
                "send_message", {"message": "One", "agent": "chat", "idempotency_key": prefix}
            ),
        }

    seen = _in_process(alice, calls)
    for name in ("long", "control"):
        assert seen[name].is_error and "1 to 200 printable characters" in _text(seen[name]), _text(seen[name])
    assert not seen["first"].is_error
    # The refused calls made no session and saved no message; the key that fits was kept whole.
    assert ChatSession.objects.filter(user=alice).count() == 1
    assert list(Turn.objects.filter(session__user=alice).values_list("idempotency_key", flat=True)) == [prefix]


def test_list_memories_refuses_an_offset_past_bigint_as_a_validation_error(alice: Any) -> None:
    async def calls(client: Client) -> Any:
        return await client.call_tool("list_memories", {"offset": 10**30}), await client.call_tool(
            "forget_memory", {"memory_id": 10**30}
        )

    listed, forgotten = _in_process(alice, calls)
    for result, argument in ((listed, "offset"), (forgotten, "memory_id")):
        # The arguments' own validation error, naming the argument and its bound (it was a crash in the query).
        text = _text(result)
        assert result.is_error and "validation error" in text and argument in text, text
        assert "less than or equal to 9223372036854775807" in text and "Traceback" not in text


def test_list_memories_lists_what_is_in_force_as_the_other_doors_do(alice: Any) -> None:
    now = timezone.now()
    memory_create(user=alice, kind="semantic", text="Alice likes green tea.")
    expired = memory_create(user=alice, kind="semantic", text="Alice is in Rome this week.")
    Memory.objects.filter(pk=expired.pk).update(expires_at=now - timedelta(days=1))
    later = memory_create(user=alice, kind="semantic", text="Alice will live in Oslo.")
    Memory.objects.filter(pk=later.pk).update(valid_from=now + timedelta(days=30))

    async def calls(client: Client) -> Any:
        return await client.call_tool("list_memories", {})

    listed = _text(_in_process(alice, calls))
    assert "green tea" in listed and "Rome" not in listed and "Oslo" not in listed
    assert [m.text for m in memories_in_force(user=alice)] == ["Alice likes green tea."]


def test_someone_elses_session_resource_is_not_found_as_a_missing_one(alice: Any, bob: Any) -> None:
    agent = make_agent("chat")
    theirs = ChatSession.objects.create(user=bob, agent=agent, workflow="free_chat", state="CHATTING")
    mine = ChatSession.objects.create(user=alice, agent=agent, workflow="free_chat", state="CHATTING")

    async def calls(client: Client) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for name, uri in [
            ("theirs_transcript", f"session://{theirs.pk}/transcript"),
            ("theirs_state", f"session://{theirs.pk}/state"),
            ("missing", "session://00000000-0000-4000-8000-000000000000/state"),
            ("mine", f"session://{mine.pk}/state"),
        ]:
            try:
                seen[name] = await client.read_resource(uri)
            except MCPError as exc:
                seen[name] = exc
        return seen

    seen = _in_process(alice, calls)
    assert '"CHATTING"' in seen["mine"].contents[0].text
    for name in ("theirs_transcript", "theirs_state", "missing"):
        error = seen[name]
        assert isinstance(error, MCPError) and error.code == INVALID_PARAMS, (name, error)
        assert "no session" in error.message and "bob" not in error.message


def test_text_that_cannot_be_stored_is_a_tool_error_naming_the_argument(alice: Any) -> None:
    memory_create(user=alice, kind="semantic", text="Alice likes green tea.")

    async def calls(client: Client) -> dict[str, Any]:
        return {
            "text": await client.call_tool("add_memory", {"text": "Likes \ud800 figs"}),
            "fact_key": await client.call_tool("add_memory", {"text": "Likes figs", "fact_key": "fruit\udfff"}),
            "query": await client.call_tool("search_memory", {"query": "green \udc00 tea"}),
        }

    seen = _in_process(alice, calls)
    for name, result in seen.items():
        text = _text(result)
        assert result.is_error and f"{name}: contains" in text and "lone surrogate" in text, text
    assert Memory.objects.filter(user=alice).count() == 1


def test_fork_session_branches_my_session_and_not_someone_elses(alice: Any, bob: Any) -> None:
    from orchestrator.runtime import turn_run
    from sessions.services import session_create

    agent = make_agent("chat")
    mine = session_create(user=alice, agent=agent)
    for message in ("Hello", "Tell me a joke"):
        turn_run(session=mine, message=message)
    theirs = session_create(user=bob, agent=agent)
    turn_run(session=theirs, message="Bob's secret")

    async def calls(client: Client) -> dict[str, Any]:
        return {
            "mine": await client.call_tool("fork_session", {"session_id": str(mine.pk), "turn": 2}),
            "theirs": await client.call_tool("fork_session", {"session_id": str(theirs.pk), "turn": 1}),
            "no_turn": await client.call_tool("fork_session", {"session_id": str(mine.pk), "turn": 9}),
        }

    seen = _in_process(alice, calls)
    assert not seen["mine"].is_error, _text(seen["mine"])
    branch = ChatSession.objects.get(parent=mine)
    assert str(branch.pk) in _text(seen["mine"]) and branch.fork_seq == 2
    assert list(branch.turns.values_list("user_message", flat=True)) == ["Hello"]
    assert seen["theirs"].is_error and "no session" in _text(seen["theirs"])
    assert seen["no_turn"].is_error and "no turn 9" in _text(seen["no_turn"])
    assert not ChatSession.objects.filter(parent=theirs).exists()
    assert ChatSession.objects.filter(user=alice).count() == 2
