"""The like-for-like side of ``python -m bench concurrency``: a plain LangGraph app on uvicorn, as its docs build one.

A turn is a two-node graph, as the app's turn makes two model calls: ``route`` (a structured call, the answer a
JSON schema's instance) and ``reply`` (a streamed call whose words go out through LangGraph's stream writer).
The graph is checkpointed in PostgreSQL by ``AsyncPostgresSaver`` on a pool of connections; each request runs
``graph.astream(..., stream_mode="custom")`` on the chat's thread and sends its words as server-sent events
in the app's shape (``turn``, ``delta``, ``done``), so the same load client measures both. No accounts, no
memory, no workflow: the least a LangGraph server does for a streamed chat turn.

Served by ``uvicorn bench.langgraph_server:app`` with ``LANGGRAPH_DATABASE_URL`` (the checkpoints' database),
``LANGGRAPH_MODEL_URL`` (the stand-in's ``/v1``) and ``LANGGRAPH_POOL_SIZE`` (connections per process, 20).
Routes: ``POST /api/sessions/<id>/messages/stream/`` (JSON ``{"message": ...}``) and ``GET /healthz``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypedDict

import httpx

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

ROUTE_SCHEMA = {"type": "object", "properties": {"action": {"enum": ["answer"]}}, "required": ["action"]}


class TurnState(TypedDict, total=False):
    messages: list[dict[str, str]]
    route: str


async def _locked(conn: Any, key: int) -> bool:
    """Whether this connection took the advisory lock ``key`` (without waiting for it)."""
    row = await (await conn.execute("SELECT pg_try_advisory_lock(%s) AS got", (key,))).fetchone()
    return bool(row and row["got"])


class _App:
    def __init__(self) -> None:
        self.graph: Any = None
        self.pool: Any = None
        self.model: httpx.AsyncClient | None = None

    async def startup(self) -> None:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from langgraph.config import get_stream_writer
        from langgraph.graph import END, START, StateGraph
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        size = int(os.environ.get("LANGGRAPH_POOL_SIZE", "20"))
        self.pool = AsyncConnectionPool(
            os.environ["LANGGRAPH_DATABASE_URL"],
            min_size=1,
            max_size=size,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=False,
        )
        await self.pool.open()
        saver = AsyncPostgresSaver(self.pool)
        # Both uvicorn processes start at once: one creates the checkpoint tables while the other waits (without
        # the lock the second's CREATE raced the first's, its startup failed, and half the requests did too).
        # The waiter polls (pg_try_advisory_lock, then a sleep with no statement open): a blocked
        # pg_advisory_lock would be a running statement that the setup's CREATE INDEX CONCURRENTLY waits out.
        async with self.pool.connection() as conn:
            while not await _locked(conn, 4242):
                await asyncio.sleep(0.2)
            try:
                await saver.setup()
            finally:
                await conn.execute("SELECT pg_advisory_unlock(4242)")
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=1024)
        self.model = model = httpx.AsyncClient(base_url=os.environ["LANGGRAPH_MODEL_URL"], timeout=600, limits=limits)

        async def route(state: TurnState) -> TurnState:
            body = {
                "model": "stand-in",
                "messages": state["messages"][-8:],
                "response_format": {"type": "json_schema", "json_schema": {"name": "Route", "schema": ROUTE_SCHEMA}},
            }
            answer = (await model.post("/chat/completions", json=body)).raise_for_status().json()
            return {"route": json.loads(answer["choices"][0]["message"]["content"])["action"]}

        async def reply(state: TurnState) -> TurnState:
            write = get_stream_writer()
            words: list[str] = []
            body = {"model": "stand-in", "messages": state["messages"][-8:], "stream": True}
            async with model.stream("POST", "/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    for choice in json.loads(line[6:]).get("choices", []):
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            words.append(text)
                            write({"delta": text})
            return {"messages": [*state["messages"], {"role": "assistant", "content": "".join(words)}]}

        builder = StateGraph(TurnState)
        builder.add_node("route", route)
        builder.add_node("reply", reply)
        builder.add_edge(START, "route")
        builder.add_edge("route", "reply")
        builder.add_edge("reply", END)
        self.graph = builder.compile(checkpointer=saver)

    async def shutdown(self) -> None:
        if self.model is not None:
            await self.model.aclose()
        if self.pool is not None:
            await self.pool.close()

    async def turn(self, thread: str, message: str, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            }
        )

        async def event(name: str, data: dict[str, Any]) -> None:
            body = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            await send({"type": "http.response.body", "body": body, "more_body": True})

        config = {"configurable": {"thread_id": thread}}
        state = await self.graph.aget_state(config)
        history = list((state.values or {}).get("messages", []))
        await event("turn", {"thread": thread})
        try:
            async for chunk in self.graph.astream(
                {"messages": [*history, {"role": "user", "content": message}]}, config, stream_mode="custom"
            ):
                await event("delta", {"text": chunk["delta"]})
            await event("done", {})
        except Exception as exc:  # noqa: BLE001 - the load client counts it as a failure
            await event("error", {"message": f"{type(exc).__name__}: {exc}"})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


_app = _App()


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _plain(send: Send, status: int, text: str) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": text.encode()})


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await _app.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await _app.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
    path, method = scope["path"], scope["method"]
    if path == "/healthz":
        await _plain(send, 200, "ok")
        return
    parts = path.strip("/").split("/")
    if (
        method == "POST"
        and len(parts) == 5
        and parts[:2] == ["api", "sessions"]
        and parts[3:] == ["messages", "stream"]
    ):
        payload = json.loads(await _body(receive) or b"{}")
        await _app.turn(parts[2], str(payload.get("message", "")), send)
        return
    await _plain(send, 404, "not found")
