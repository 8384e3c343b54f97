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

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import close_old_connections
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from pydantic import Field
from rest_framework.authtoken.models import Token

from agents.models import Agent
from agents.selectors import active_agent, active_agents
from core.incoming import BIGINT_MAX, Unstorable, storable_str
from core.incoming import idempotency_key as valid_idempotency_key
from core.throttles import messages_rate_wait
from memory.models import Memory
from memory.retrieval import memories_for_prompt
from memory.selectors import memories_in_force, memory_texts
from memory.services import memory_forget, memory_get_or_create
from orchestrator.runtime import MessageRejected, turn_run, validate_message
from sessions.locks import SessionBusyError
from sessions.models import ChatSession
from sessions.selectors import own_session, session_turns
from sessions.services import ForkRefused, session_create, session_fork

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
    session = own_session(user, session_id)
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


def _search_rows(user: Any, query: str, limit: int) -> list[dict[str, Any]]:
    """The retriever's candidates for ``query``, each with its full text and why it would (not) be used."""
    result = memories_for_prompt(user=user, query=query[:2000], budget_tokens=4000, touch=False)
    texts = memory_texts(user=user, ids=[c.id for c in result.candidates])
    return [
        {"id": c.id, "kind": c.kind, "text": texts.get(c.id, c.preview), "used": c.kept, "why": c.reason}
        for c in result.candidates[: max(1, min(limit, 50))]
    ]


def _memory_row(memory: Memory) -> dict[str, Any]:
    return {
        "id": memory.pk,
        "kind": memory.kind,
        "text": memory.text,
        "pinned": memory.pinned,
        "occurred_at": memory.occurred_at.isoformat(),
    }


def _agent_row(agent: Agent) -> dict[str, Any]:
    return {"slug": agent.slug, "name": agent.name, "description": agent.description, "workflow": agent.workflow}


def _session_for_message(user: Any, session_id: str, agent: str) -> ChatSession:
    """The session a message goes to: one of ``user``'s by id, or a new one with the active agent ``agent``."""
    if session_id:
        return _own_session(user, session_id)
    found = active_agent(agent)
    if found is None:
        raise ToolError("give session_id, or the slug of an active agent (list_agents)")
    return session_create(user=user, agent=found)


def _send(user: Any, message: str, *, session_id: str, agent: str, key: str | None) -> dict[str, Any]:
    """One turn through the normal loop (its lock, checkpoints and idempotency), after the messages rate."""
    wait = messages_rate_wait(SimpleNamespace(user=user, META={}))
    if wait is not None:
        raise ToolError(f"too many messages; try again in {wait} seconds")
    session = _session_for_message(user, session_id, agent)
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


def _fork(user: Any, session_id: str, turn: int) -> dict[str, Any]:
    """A branch of one of ``user``'s sessions at ``turn`` (the REST door's ``fork``, the same service)."""
    session = _own_session(user, session_id)
    try:
        branch = session_fork(session=session, at_turn=turn, actor=user)
    except (ForkRefused, SessionBusyError) as exc:
        raise ToolError(exc.message_for_people()) from exc
    return {
        "session_id": str(branch.pk),
        "chat_id": str(branch.chat_id),
        "parent": str(session.pk),
        "fork_turn": turn,
        **_session_state(branch),
    }


def _transcript(user: Any, session_id: str) -> str:
    session = _own_session(user, session_id, missing=ResourceNotFoundError)
    turns = session_turns(session=session).values("seq", "user_message", "assistant_message", "status")
    return json.dumps(list(turns))


def _add_memory_tools(server: MCPServer) -> None:
    @server.tool(description="Search my memories with the agent's tiered retriever; each result says why.")
    async def search_memory(query: str, ctx: Context, limit: int = 10) -> list[dict[str, Any]]:
        user = await _user(ctx)
        if not query.strip():
            raise ToolError("query is empty")
        _storable_or_refuse(query=query)
        return await db(lambda: _search_rows(user, query, limit))

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
        key = fact_key if kind == "semantic" else ""
        memory, created = await db(
            lambda: memory_get_or_create(user=user, kind=kind, text=text, fact_key=key, pinned=pinned)
        )
        return {"id": memory.pk, "created": created}

    @server.tool(description="My memories in force, newest first.")
    async def list_memories(
        ctx: Context, limit: int = 50, offset: Annotated[int, Field(ge=0, le=BIGINT_MAX)] = 0
    ) -> list[dict[str, Any]]:
        user = await _user(ctx)
        window = slice(offset, offset + max(1, min(limit, 200)))
        # The same selector as the other doors: an expired memory, or one not valid yet, is not in force.
        return await db(lambda: [_memory_row(m) for m in memories_in_force(user=user)[window]])

    @server.tool(description="Forget one of my memories for good.")
    async def forget_memory(memory_id: Annotated[int, Field(ge=1, le=BIGINT_MAX)], ctx: Context) -> dict[str, Any]:
        user = await _user(ctx)
        if not await db(lambda: memory_forget(user=user, memory_id=memory_id)):
            raise ToolError(f"no memory {memory_id}")
        return {"forgotten": memory_id}


def _add_agent_tools(server: MCPServer) -> None:
    @server.tool(description="The agents I can talk to.")
    async def list_agents(ctx: Context) -> list[dict[str, Any]]:
        await _user(ctx)
        return await db(lambda: [_agent_row(a) for a in active_agents()])

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
        return await db(lambda: _send(user, message, session_id=session_id, agent=agent, key=key))


def _add_session_tools(server: MCPServer) -> None:
    @server.tool(description="Where one of my sessions stands: workflow state, collected data, status.")
    async def session_state(session_id: str, ctx: Context) -> dict[str, Any]:
        user = await _user(ctx)
        return await db(lambda: _session_state(_own_session(user, session_id)))

    @server.tool(
        description="Branch one of my sessions at a turn (its number, from 1): a new session that starts from the "
        "state before that turn, with the turns before it; nothing is run again. Send it a message (an edited one, "
        "or the same one to get another reply) with send_message and the new session_id."
    )
    async def fork_session(
        session_id: str, turn: Annotated[int, Field(ge=1, le=2**31 - 1)], ctx: Context
    ) -> dict[str, Any]:
        user = await _user(ctx)
        return await db(lambda: _fork(user, session_id, turn))

    @server.resource("session://{session_id}/transcript", mime_type="application/json")
    async def transcript(session_id: str, ctx: Context) -> str:
        user = await _user(ctx)
        return await db(lambda: _transcript(user, session_id))

    @server.resource("session://{session_id}/state", mime_type="application/json")
    async def state(session_id: str, ctx: Context) -> str:
        user = await _user(ctx)
        found = await db(lambda: _session_state(_own_session(user, session_id, missing=ResourceNotFoundError)))
        return json.dumps(found)


def build_server() -> MCPServer:
    """The tools and resources, each a thin door over the selectors and services the REST API calls."""
    server = MCPServer(
        name="agents-runtime",
        version=str(settings.SPECTACULAR_SETTINGS["VERSION"]),  # the API's version (it was empty)
        instructions="The user's memories (search, add, list, forget) and their agents (list, send a message).",
    )
    _add_memory_tools(server)
    _add_agent_tools(server)
    _add_session_tools(server)
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
