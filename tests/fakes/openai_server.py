"""A real HTTP server that speaks the OpenAI chat-completions and embeddings protocol, for tests.

Tests enqueue the responses it should give, in order, then point a provider at ``base_url``::

    with FakeOpenAIServer() as server:
        server.enqueue(error(429, headers={"Retry-After": "0"}), reply("hello"))
        ...
        assert [r.path for r in server.requests] == ["/v1/chat/completions"] * 2

Chat completions answer from the queue (JSON, SSE streams, tool calls, errors, hangs, cut
streams); with nothing queued they answer 400 "nothing queued" so a missing script fails loudly
instead of being retried. Embeddings answer from the queue when something is queued for them,
else with deterministic vectors derived from the text.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"


@dataclass
class FakeResponse:
    """One scripted answer. ``stream`` (a list of chunk dicts) makes it an SSE response."""

    status: int = 200
    body: Any = None  # a JSON-able object, or a str sent as is
    headers: dict[str, str] = field(default_factory=dict)
    stream: list[dict[str, Any]] | None = None
    # Seconds to wait before answering (longer than the client's read timeout = a hang).
    hang: float = 0.0
    # For streams: stop after this many chunks and close the connection without [DONE].
    cut_after: int | None = None
    # For streams: seconds between two chunks (a model that writes slowly).
    chunk_delay: float = 0.0
    path: str = CHAT_PATH


@dataclass
class ReceivedRequest:
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []


def tool_names(request: ReceivedRequest) -> list[str]:
    """The names of the functions a chat request offered the model, in order."""
    return [t["function"]["name"] for t in request.body.get("tools", [])] if isinstance(request.body, dict) else []


# --- response builders --------------------------------------------------------------------------------
def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def tool_call(name: str, arguments: dict[str, Any] | str, *, call_id: str = "call_1") -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def reply(
    text: str = "",
    *,
    finish_reason: str = "stop",
    tool_calls: list[dict[str, Any]] | None = None,
    model: str = "fake-model",
    prompt_tokens: int = 11,
    completion_tokens: int | None = None,
) -> FakeResponse:
    """A non-streamed chat completion."""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": _usage(prompt_tokens, completion_tokens if completion_tokens is not None else len(text.split())),
    }
    return FakeResponse(body=body)


def json_reply(obj: Any, **kwargs: Any) -> FakeResponse:
    """A chat completion whose content is ``obj`` as JSON (a structured answer)."""
    return reply(json.dumps(obj), **kwargs)


def stream(
    text: str = "",
    *,
    finish_reason: str | None = "stop",
    tool_calls: list[dict[str, Any]] | None = None,
    model: str = "fake-model",
    include_usage: bool = True,
    prompt_tokens: int = 11,
    cut_after: int | None = None,
    hang: float = 0.0,
    pieces: list[str] | None = None,
    chunk_delay: float = 0.0,
) -> FakeResponse:
    """A streamed chat completion: one chunk per word, tool calls in pieces, then finish and usage.

    ``pieces`` gives the text's chunks instead of ``text`` split into words (and a tool call's arguments
    go in as many pieces as it has, not two); ``finish_reason=None`` ends the stream (with [DONE])
    without ever giving a finish reason; ``cut_after=n`` drops the connection after n chunks.
    """
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    chunks: list[dict[str, Any]] = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    words = list(pieces) if pieces is not None and not tool_calls else _split_keep_space(text)
    for word in words:
        chunks.append({**base, "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]})
    for index, call in enumerate(tool_calls or []):
        first = {"index": index, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"]}}
        chunks.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
        args = call["function"]["arguments"]
        for piece in pieces if pieces is not None else (args[: len(args) // 2], args[len(args) // 2 :]):
            delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            chunks.append({**base, "choices": [{"index": 0, "delta": delta}]})
    if finish_reason is not None:
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": _usage(prompt_tokens, len(words))})
    return FakeResponse(stream=chunks, cut_after=cut_after, hang=hang, chunk_delay=chunk_delay)


def error(status: int, message: str = "", *, headers: dict[str, str] | None = None) -> FakeResponse:
    """An OpenAI-style error body with ``status`` (429, 500, 400, …)."""
    body = {"error": {"message": message or f"fake error {status}", "type": "fake_error", "code": str(status)}}
    return FakeResponse(status=status, body=body, headers=dict(headers or {}))


def hang(seconds: float, then: FakeResponse | None = None) -> FakeResponse:
    """Wait ``seconds`` before answering (``then``, or a plain reply) — past a client's read timeout, a hang."""
    response = then or reply("too late")
    response.hang = seconds
    return response


def embeddings(vectors: list[list[float]], *, model: str = "fake-embedding") -> FakeResponse:
    body = {
        "object": "list",
        "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }
    return FakeResponse(body=body, path=EMBEDDINGS_PATH)


def fake_vector(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for ``text`` (same text, same vector)."""
    values: list[float] = []
    counter = 0
    while len(values) < dimensions:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        values.extend((b - 127.5) / 127.5 for b in digest)
        counter += 1
    values = values[:dimensions]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _split_keep_space(text: str) -> list[str]:
    pieces: list[str] = []
    current = ""
    for char in text:
        current += char
        if char.isspace():
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    return pieces


# --- the server ---------------------------------------------------------------------------------------
class FakeOpenAIServer:
    """A ThreadingHTTPServer on 127.0.0.1 (a free port) with queues of scripted responses."""

    def __init__(self, *, embedding_dimensions: int = 384) -> None:
        self.embedding_dimensions = embedding_dimensions
        self.requests: list[ReceivedRequest] = []
        self._queues: dict[str, deque[FakeResponse]] = {CHAT_PATH: deque(), EMBEDDINGS_PATH: deque()}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAIServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        # Wake hanging handlers first so shutdown does not wait for them.
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def enqueue(self, *responses: FakeResponse) -> FakeOpenAIServer:
        with self._lock:
            for response in responses:
                self._queues.setdefault(response.path, deque()).append(response)
        return self

    def pending(self, path: str = CHAT_PATH) -> int:
        with self._lock:
            return len(self._queues.get(path, ()))

    def chat_requests(self) -> list[ReceivedRequest]:
        return [r for r in self.requests if r.path == CHAT_PATH]

    def profile(self, **overrides: Any) -> dict[str, Any]:
        """An ``LLM_PROFILES`` entry pointing at this server, with fast retries for tests."""
        profile: dict[str, Any] = {
            "base_url": self.base_url,
            "model": "fake-model",
            "api_key_env": "",
            "connect_timeout": 2.0,
            "read_timeout": 5.0,
            "max_retries": 2,
            "supports_json_schema": True,
            "retry_base_delay": 0.01,
            "retry_max_delay": 0.05,
            "max_retry_after": 5.0,
        }
        profile.update(overrides)
        return profile

    # Called by the handler threads.
    def _take(self, path: str, body: Any, headers: dict[str, str]) -> FakeResponse | None:
        with self._lock:
            self.requests.append(ReceivedRequest(path=path, headers=headers, body=body))
            queue = self._queues.get(path)
            return queue.popleft() if queue else None

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; ``False`` when the server is stopping."""
        return not self._stopping.wait(seconds)


def _handler_for(server: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body: Any = json.loads(raw or b"null")
            except ValueError:
                body = raw.decode(errors="replace")
            path = self.path.split("?", 1)[0]
            response = server._take(path, body, {k.lower(): v for k, v in self.headers.items()})
            if response is None:
                response = self._default(path, body)
            if response.hang and not server._wait(response.hang):
                return
            try:
                if response.stream is not None and response.status == 200:
                    self._send_stream(response)
                else:
                    self._send_json(response)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): nothing to answer

        def _default(self, path: str, body: Any) -> FakeResponse:
            if path == EMBEDDINGS_PATH and isinstance(body, dict):
                texts = body.get("input", [])
                texts = [texts] if isinstance(texts, str) else list(texts)
                return embeddings([fake_vector(str(t), server.embedding_dimensions) for t in texts])
            return error(400, f"fake server: nothing queued for {path}")

        def _send_json(self, response: FakeResponse) -> None:
            payload = response.body if isinstance(response.body, str) else json.dumps(response.body)
            data = payload.encode()
            self.send_response(response.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in response.headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _send_stream(self, response: FakeResponse) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            for key, value in response.headers.items():
                self.send_header(key, value)
            self.end_headers()
            chunks = response.stream or []
            for count, chunk in enumerate(chunks):
                if response.cut_after is not None and count >= response.cut_after:
                    self.close_connection = True
                    self.wfile.flush()
                    return
                if count and response.chunk_delay:
                    time.sleep(response.chunk_delay)
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler
