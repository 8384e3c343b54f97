"""http_get against a real HTTP server on 127.0.0.1: retries, 4xx, hangs, size limits, the allow-list."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agents.tools import ToolContext, run_tool_call
from agents.tools.faults import faults
from llm.base import ToolCallRequest

pytestmark = pytest.mark.django_db


class Upstream(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.hits: Counter[str] = Counter()
        self.flaky_failures = 1
        self.release = threading.Event()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Upstream

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self.server.hits[path] += 1
        if path == "/flaky":
            if self.server.hits[path] <= self.server.flaky_failures:
                self._send(503, b"try later")
            else:
                self._send(200, b"fresh data")
        elif path == "/bad":
            self._send(400, b"missing parameter q")
        elif path == "/hang":
            self.server.release.wait(10)
            self._send(200, b"too late")
        elif path == "/big":
            self._send(200, b"x" * 5000)
        elif path == "/json":
            self._send(200, json.dumps({"temp": 21}).encode(), "application/json")
        elif path == "/image":
            self._send(200, b"\x89PNG\r\n\x1a\n" + bytes(100), "image/png")
        elif path == "/redirect":
            self._send(302, b"", Location="/json")
        elif path == "/escape":
            self._send(302, b"", Location="http://example.invalid/secret")
        else:
            self._send(404, b"no such page")


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def tool_settings(settings: Any) -> Iterator[None]:
    settings.TOOLS_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.TOOLS_RETRY_BASE_DELAY = 0.01
    settings.TOOLS_RETRY_MAX_DELAY = 0.05
    settings.TOOLS_MAX_ATTEMPTS = 3
    settings.TOOLS_FAULTS = ""
    yield
    faults.clear()


@pytest.fixture
def context(alice: Any) -> ToolContext:
    return ToolContext(user=alice)


def get(context: ToolContext, url: str, **extra: Any) -> Any:
    call = ToolCallRequest(id="h1", name="http_get", arguments=json.dumps({"url": url, **extra}))
    return run_tool_call(call=call, context=context, enabled=["http_get"])


def test_503_then_200_is_retried(upstream: Upstream, context: ToolContext) -> None:
    result = get(context, f"{upstream.base}/flaky")
    assert result.ok, result.content
    assert result.attempts == 2
    assert upstream.hits["/flaky"] == 2
    assert result.content.startswith("HTTP 200 OK")
    assert result.content.endswith("fresh data")


def test_503_every_time_gives_up(upstream: Upstream, context: ToolContext) -> None:
    upstream.flaky_failures = 100
    result = get(context, f"{upstream.base}/flaky")
    assert result.error_kind == "http_5xx"
    assert result.attempts == 3 == upstream.hits["/flaky"]
    assert "HTTP 503" in result.content and result.content.startswith("TOOL_ERROR:")


def test_400_is_not_retried(upstream: Upstream, context: ToolContext) -> None:
    result = get(context, f"{upstream.base}/bad")
    assert not result.ok
    assert result.error_kind == "http_4xx"
    assert result.attempts == 1 == upstream.hits["/bad"]
    assert result.content.startswith("TOOL_ERROR: http_get failed")
    assert "HTTP 400" in result.content and "missing parameter q" in result.content


def test_a_hang_past_the_http_timeout(upstream: Upstream, context: ToolContext, settings: Any) -> None:
    settings.TOOLS_HTTP_TIMEOUT = 0.3
    settings.TOOLS_MAX_ATTEMPTS = 2
    result = get(context, f"{upstream.base}/hang")
    assert not result.ok
    assert result.error_kind == "timeout"
    assert result.attempts == 2 == upstream.hits["/hang"]
    assert result.content.startswith("TOOL_ERROR: http_get timed out")


def test_a_hang_past_the_tool_deadline(upstream: Upstream, context: ToolContext, settings: Any) -> None:
    # The client would wait 30 s; the registry's deadline abandons the attempt first.
    settings.TOOLS_HTTP_TIMEOUT = 30
    settings.TOOLS_DEFAULT_TIMEOUT = 0.3
    settings.TOOLS_MAX_ATTEMPTS = 1
    result = get(context, f"{upstream.base}/hang")
    assert result.error_kind == "timeout"
    assert result.content.startswith("TOOL_ERROR: http_get timed out after 0.3 s")


def test_a_body_over_the_limit_is_cut_and_marked(upstream: Upstream, context: ToolContext, settings: Any) -> None:
    result = get(context, f"{upstream.base}/big", max_bytes=1000)
    assert result.ok
    body = result.content.split("\n\n", 1)[1]
    assert body.startswith("x" * 1000)
    assert "x" * 1001 not in body
    assert "[truncated: the body is larger than 1000 bytes" in body

    settings.TOOLS_HTTP_MAX_BYTES = 2048  # the server-wide limit applies when the model asks for none
    result = get(context, f"{upstream.base}/big")
    assert "x" * 2048 in result.content and "x" * 2049 not in result.content
    assert "[truncated" in result.content

    result = get(context, f"{upstream.base}/big", max_bytes=4096)  # above the limit: refused before fetching
    assert result.error_kind == "invalid_arguments"
    assert "max_bytes: Value error, must be at most 2048" in result.content
    assert upstream.hits["/big"] == 2


def test_a_small_body_is_returned_whole(upstream: Upstream, context: ToolContext) -> None:
    result = get(context, f"{upstream.base}/json")
    assert result.ok
    assert "Content-Type: application/json" in result.content
    assert result.content.endswith('{"temp": 21}')
    assert "truncated" not in result.content


def test_binary_bodies_are_not_dumped_into_the_prompt(upstream: Upstream, context: ToolContext) -> None:
    result = get(context, f"{upstream.base}/image")
    assert result.ok
    assert "[binary body of 108 bytes not shown]" in result.content


def test_redirects_are_followed_and_checked(upstream: Upstream, context: ToolContext) -> None:
    result = get(context, f"{upstream.base}/redirect")
    assert result.ok
    assert result.content.endswith('{"temp": 21}')
    assert upstream.hits["/redirect"] == upstream.hits["/json"] == 1

    result = get(context, f"{upstream.base}/escape")
    assert result.error_kind == "invalid_arguments"
    assert "'example.invalid' is not on the allow-list" in result.content


def test_a_host_not_on_the_allow_list_is_refused_without_connecting(
    upstream: Upstream, context: ToolContext, settings: Any
) -> None:
    settings.TOOLS_HTTP_ALLOWED_HOSTS = ["api.example.com"]
    result = get(context, f"{upstream.base}/json")
    assert not result.ok
    assert result.error_kind == "invalid_arguments"
    assert result.attempts == 1  # refused, not retried
    assert "'127.0.0.1' is not on the allow-list, so it was refused without connecting" in result.content
    assert sum(upstream.hits.values()) == 0


def test_the_wildcard_does_not_reach_private_addresses(upstream: Upstream, context: ToolContext, settings: Any) -> None:
    settings.TOOLS_HTTP_ALLOWED_HOSTS = ["*"]
    for url in (f"{upstream.base}/json", f"http://localhost:{upstream.server_address[1]}/json"):
        result = get(context, url)
        assert result.error_kind == "invalid_arguments", result.content
        assert "resolves to a non-public address" in result.content
    assert sum(upstream.hits.values()) == 0


def test_only_http_urls(context: ToolContext) -> None:
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/x", "not a url at all"):
        result = get(context, url)
        assert result.error_kind == "invalid_arguments"
        assert "url: Value error" in result.content
