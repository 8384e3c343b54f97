"""The memory and the agents over the Model Context Protocol (the official ``mcp`` SDK).

Tools: ``search_memory`` (the tiered retriever, with its reasons), ``add_memory``, ``list_memories``,
``forget_memory``, ``list_agents``, ``send_message`` (a turn through the normal loop: its lock, checkpoints and
idempotency), ``session_state``; resources ``session://{session_id}/transcript`` and ``.../state``.

Over streamable HTTP (``manage.py mcp --http``, stateless, JSON answers) every request is authenticated with
the same API tokens as the REST API (``Authorization: Bearer <key>`` or ``Token <key>``), checked again on each
request: a revoked token stops working at once. Over stdio (``manage.py mcp --user NAME``, for a desktop
client) the process acts for that one user. Either way only that user's data is reachable: someone else's
ids are "not found", exactly as a missing one.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Awaitable, Callable, MutableMapping
from types import SimpleNamespace
from typing import Annotated, Any, Literal
from uuid import UUID

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import close_old_connections
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from pydantic import Field
from rest_framework.authtoken.models import Token

from agents.models import Agent
from core.incoming import BIGINT_MAX, Unstorable, storable_str
from core.incoming import idempotency_key as valid_idempotency_key
from core.throttles import messages_rate_wait
from memory.models import Memory
from memory.retrieval import memories_for_prompt
from memory.selectors import memories_in_force
from memory.services import memory_get_or_create
from orchestrator.runtime import MessageRejected, turn_run, validate_message
from sessions.locks import SessionBusyError
from sessions.models import ChatSession
from sessions.services import session_create

# The user a stdio server acts for (set by ``manage.py mcp --user``); HTTP requests carry their token instead.
STDIO_USER: contextvars.ContextVar[Any] = contextvars.ContextVar("mcp_stdio_user", default=None)
NOT_AUTHENTICATED = "not authenticated: send Authorization: Bearer <your API token>"


async def db(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (ORM code) on a thread of its own, not the one shared thread: a long turn of one user must
    not hold everyone's requests. Connections that broke (a database restart) are dropped before and after."""

    def run() -> Any:
        close_old_connections()
        try:
            return fn()
        finally:
            close_old_connections()

    return await sync_to_async(run, thread_sensitive=False)()


def user_for_token(header: str | None) -> Any:
    """The active user whose API token the Authorization header carries, or None."""
    if not header:
        return None
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() not in ("bearer", "token") or not key.strip():
        return None
    token = Token.objects.select_related("user").filter(key=key.strip()).first()
    return token.user if token is not None and token.user.is_active else None


async def _user(ctx: Context) -> Any:
    fixed = STDIO_USER.get()
    if fixed is not None:
        return fixed
    headers = ctx.headers or {}
    user = await db(lambda: user_for_token(headers.get("authorization")))
    if user is None:
        raise ToolError(NOT_AUTHENTICATED)
    return user


def _own_session(user: Any, session_id: str, *, missing: type[Exception] = ToolError) -> ChatSession:
    """One of ``user``'s sessions; ``missing`` (a tool error, or a resource's "not found") for any other id,
    someone else's as much as one that does not exist."""
    try:
        key = UUID(session_id)
    except ValueError:
        raise missing(f"no session {session_id!r}") from None
    session = ChatSession.objects.select_related("agent").filter(pk=key, user=user).first()
    if session is None:
        raise missing(f"no session {session_id!r}")
    return session


def _storable_or_refuse(**texts: str) -> None:
    """A tool error naming the first argument PostgreSQL cannot store (a NUL, a lone surrogate): the rule every
    door shares (``core.incoming``), before anything is written or searched."""
    try:
        for name, value in texts.items():
            storable_str(value, field=name)
    except Unstorable as exc:
        raise ToolError(str(exc)) from None


def _session_state(session: ChatSession) -> dict[str, Any]:
    return {"workflow": session.workflow, "state": session.state, "data": session.data, "status": session.status}


def build_server() -> MCPServer:
    server = MCPServer(
        name="agents-runtime",
        instructions="The user's memories (search, add, list, forget) and their agents (list, send a message).",
    )

    @server.tool(description="Search my memories with the agent's tiered retriever; each result says why.")
    async def search_memory(query: str, ctx: Context, limit: int = 10) -> list[dict[str, Any]]:
        user = await _user(ctx)
        if not query.strip():
            raise ToolError("query is empty")
        _storable_or_refuse(query=query)

        def run() -> list[dict[str, Any]]:
            result = memories_for_prompt(user=user, query=query[:2000], budget_tokens=4000, touch=False)
            texts = dict(
                Memory.objects.filter(user=user, pk__in=[c.id for c in result.candidates]).values_list("pk", "text")
            )
            return [
                {"id": c.id, "kind": c.kind, "text": texts.get(c.id, c.preview), "used": c.kept, "why": c.reason}
                for c in result.candidates[: max(1, min(limit, 50))]
            ]

        return await db(run)

    @server.tool(description="Remember something about me.")
    async def add_memory(
        text: str,
        ctx: Context,
        kind: Literal["semantic", "episodic"] = "semantic",
        fact_key: str = "",
        pinned: bool = False,
    ) -> dict[str, Any]:
        user = await _user(ctx)
        if not text.strip() or "\x00" in text or len(text) > 20_000:
            raise ToolError("text must be 1 to 20,000 characters, without NUL")
        if len(fact_key) > 80:
            raise ToolError("fact_key is at most 80 characters")
        _storable_or_refuse(text=text, fact_key=fact_key)

        def run() -> dict[str, Any]:
            memory, created = memory_get_or_create(
                user=user, kind=kind, text=text, fact_key=fact_key if kind == "semantic" else "", pinned=pinned
            )
            return {"id": memory.pk, "created": created}

        return await db(run)

    @server.tool(description="My memories in force, newest first.")
    async def list_memories(
        ctx: Context, limit: int = 50, offset: Annotated[int, Field(ge=0, le=BIGINT_MAX)] = 0
    ) -> list[dict[str, Any]]:
        user = await _user(ctx)
        window = slice(offset, offset + max(1, min(limit, 200)))

        def run() -> list[dict[str, Any]]:
            # The same selector as the other doors: an expired memory, or one not valid yet, is not in force.
            rows = memories_in_force(user=user)
            return [
                {
                    "id": m.pk,
                    "kind": m.kind,
                    "text": m.text,
                    "pinned": m.pinned,
                    "occurred_at": m.occurred_at.isoformat(),
                }
                for m in rows[window]
            ]

        return await db(run)

    @server.tool(description="Forget one of my memories for good.")
    async def forget_memory(memory_id: Annotated[int, Field(ge=1, le=BIGINT_MAX)], ctx: Context) -> dict[str, Any]:
        user = await _user(ctx)
        deleted = await db(lambda: Memory.objects.filter(pk=memory_id, user=user).delete()[0])
        if not deleted:
            raise ToolError(f"no memory {memory_id}")
        return {"forgotten": memory_id}

    @server.tool(description="The agents I can talk to.")
    async def list_agents(ctx: Context) -> list[dict[str, Any]]:
        await _user(ctx)

        def run() -> list[dict[str, Any]]:
            agents = Agent.objects.filter(is_active=True).order_by("name")
            return [
                {"slug": a.slug, "name": a.name, "description": a.description, "workflow": a.workflow} for a in agents
            ]

        return await db(run)

    @server.tool(
        description="Send a message to an agent and get its reply: in one of my sessions (session_id), or a new "
        "session with the agent named by its slug. Give an idempotency_key to make a retry safe."
    )
    async def send_message(
        message: str,
        ctx: Context,
        session_id: str = "",
        agent: str = "",
        idempotency_key: str = "",
    ) -> dict[str, Any]:
        user = await _user(ctx)
        try:
            # The rules of every door, checked before a session is made for the message: a key is refused, not
            # cut (two keys sharing their first 200 characters would name one turn).
            key = valid_idempotency_key(idempotency_key)
            validate_message(message)
        except (Unstorable, MessageRejected) as exc:
            raise ToolError(exc.message_for_people()) from None

        def run() -> dict[str, Any]:
            wait = messages_rate_wait(SimpleNamespace(user=user, META={}))
            if wait is not None:
                raise ToolError(f"too many messages; try again in {wait} seconds")
            if session_id:
                session = _own_session(user, session_id)
            else:
                found = Agent.objects.filter(slug=agent, is_active=True).first() if agent else None
                if found is None:
                    raise ToolError("give session_id, or the slug of an active agent (list_agents)")
                session = session_create(user=user, agent=found)
            try:
                result = turn_run(session=session, message=message, idempotency_key=key)
            except (MessageRejected, SessionBusyError) as exc:
                raise ToolError(str(getattr(exc, "message", exc))) from exc
            turn = result.turn
            return {
                "session_id": str(session.pk),
                "turn_id": turn.pk,
                "status": turn.status,
                "reply": result.reply,
                "truncated": turn.truncated,
                "replayed": result.replayed,
            }

        return await db(run)

    @server.tool(description="Where one of my sessions stands: workflow state, collected data, status.")
    async def session_state(session_id: str, ctx: Context) -> dict[str, Any]:
        user = await _user(ctx)

        return await db(lambda: _session_state(_own_session(user, session_id)))

    @server.resource("session://{session_id}/transcript", mime_type="application/json")
    async def transcript(session_id: str, ctx: Context) -> str:
        user = await _user(ctx)

        def run() -> str:
            session = _own_session(user, session_id, missing=ResourceNotFoundError)
            turns = session.turns.order_by("seq").values("seq", "user_message", "assistant_message", "status")
            return json.dumps(list(turns))

        return await db(run)

    @server.resource("session://{session_id}/state", mime_type="application/json")
    async def state(session_id: str, ctx: Context) -> str:
        user = await _user(ctx)
        found = await db(lambda: _session_state(_own_session(user, session_id, missing=ResourceNotFoundError)))
        return json.dumps(found)

    return server


ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]
]


def http_app(path: str = "/mcp") -> Any:
    """The streamable HTTP app (stateless, JSON answers), behind a check of the API token on every request."""
    inner = build_server().streamable_http_app(streamable_http_path=path, stateless_http=True, json_response=True)

    async def app(
        scope: MutableMapping[str, Any], receive: Callable[..., Awaitable[Any]], send: Callable[..., Awaitable[Any]]
    ) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if await db(lambda: user_for_token(headers.get("authorization"))) is None:
                body = json.dumps({"error": {"code": "not_authenticated", "message": NOT_AUTHENTICATED}}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await inner(scope, receive, send)

    return app


def stdio_user_by_name(username: str) -> Any:
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise LookupError(f"no active user is called {username!r}")
    return user
