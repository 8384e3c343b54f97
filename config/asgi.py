"""The ASGI entry point that ``make run`` serves (gunicorn with uvicorn workers): Django, MCP at /mcp/ and A2A at /a2a/.

Under ASGI an event stream holds no thread while it waits (a turn runs on a turn worker and its events come
from the run channel: ``web.chat.streaming``), so one process holds thousands of open chats, and ``/healthz``
never queues behind them. The MCP server (streamable HTTP, API tokens: ``web.mcp_server``) answers on the
same port; its session manager starts with the server's lifespan.

A message's stream (``POST .../messages/stream/``) keeps one idle thread for its life: Django runs every
request in a context of its own, whose thread ends with the response. A re-joined stream (``GET
/api/turns/<id>/events/``) and a chat page's live events (``GET /chats/<id>/events/``) keep none
(``application`` below).
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_app = get_asgi_application()

from web import a2a_server  # noqa: E402 - after Django is set up
from web.health import PROBES, asgi_probe  # noqa: E402
from web.mcp_server import http_app  # noqa: E402

MCP_PATH = "/mcp/"
_FOLLOW = re.compile(r"^/api/turns/\d+/events/?$|^/chats/[0-9a-fA-F-]{36}/events/?$")
mcp_app = http_app(MCP_PATH)
a2a_app = a2a_server.http_app()

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await mcp_app(scope, receive, send)  # starts (and stops) MCP's session manager
        return
    path = str(scope.get("path", ""))
    if path.rstrip("/") in PROBES:
        await asgi_probe(scope, receive, send)  # in the event loop: never behind the process's other requests
        return
    if path == MCP_PATH.rstrip("/") or path.startswith(MCP_PATH):
        await mcp_app(scope, receive, send)
        return
    if path in (a2a_server.A2A_PATH, a2a_server.A2A_PATH.rstrip("/"), a2a_server.CARD_PATH):
        await a2a_app(scope, receive, send)  # A2A 1.0: JSON-RPC at /a2a/, the agent card (web.a2a_server)
        return
    if _FOLLOW.match(path):
        # A re-joined stream, or a chat page's live events: Django's per-request context would keep a thread for the stream's whole life. Its
        # sync parts (middleware, the view's few statements) run on asgiref's one shared thread instead, and the
        # stream itself is read in the event loop: a thousand followers hold no threads.
        await django_app.handle(scope, receive, send)
        return
    await django_app(scope, receive, send)
