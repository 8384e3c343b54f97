"""``manage.py mcp``: the MCP server (``web.mcp_server``). ``--http``: streamable HTTP at /mcp/ for any
client with an API token; ``--user NAME``: over stdio, for a desktop client acting as that user."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from web.mcp_server import STDIO_USER, build_server, http_app, stdio_user_by_name
from web.warmup import process_prepare


class Command(BaseCommand):
    help = "Run the MCP server: --http (streamable HTTP, API tokens) or --user NAME (stdio)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--http", action="store_true", help="Serve streamable HTTP at /mcp/.")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8001)
        parser.add_argument("--user", help="Serve stdio as this user.")

    def handle(self, *args: Any, **options: Any) -> None:
        process_prepare()  # the registries its tools need, before the first call (web/warmup.py)
        if options["http"]:
            import uvicorn  # noqa: PLC0415 - the HTTP server only when serving HTTP

            uvicorn.run(http_app("/mcp/"), host=options["host"], port=options["port"], log_level="warning")
            return
        if not options["user"]:
            raise CommandError("Give --http, or --user NAME for stdio.")
        try:
            user = stdio_user_by_name(options["user"])
        except LookupError as exc:
            raise CommandError(str(exc)) from exc
        STDIO_USER.set(user)
        asyncio.run(build_server().run_stdio_async())
