"""A stand-in model server for load runs: OpenAI-compatible chat completions on loopback, with a set latency.

Every call takes ``latency`` seconds, whatever it asks, as a hosted model takes a few seconds for a few hundred
tokens:
- a streamed call sends its first word after ``ttft`` seconds and the rest of a fixed ~60-word reply evenly
  until ``latency``, then the usage chunk and ``[DONE]``;
- a call with ``response_format`` of type ``json_schema`` answers, after ``latency``, the smallest instance of
  the schema (``schema_instance``: the first choice of an enum, required fields only, ``confidence`` 0.9, and
  the reply's text in a ``reply`` field); streamed, that JSON goes out word by word like a text reply, evenly
  over ``latency`` (a decision's fields first, as the schema orders them, then the reply);
- any other call answers the reply's text after ``latency``.

It never reads what it is sent beyond that, so it measures the app's handling of many slow calls, not a model.
Standard library only; a thread per connection. ``python -m bench.stand_in_model --port 9000 --latency 4`` runs
one by itself.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REPLY = (
    "Here is what I can do for you: I keep track of what we talk about, remember what matters for later, "
    "and follow a plan step by step when a task has several parts. Ask me about a trip, a booking, or "
    "anything you told me before, and I will answer from what I know, saying so when I am not sure."
)
MODEL = "stand-in"


def schema_instance(schema: dict[str, Any], defs: dict[str, Any] | None = None, key: str = "") -> Any:
    """The smallest value that ``schema`` (JSON Schema, as pydantic writes it) accepts."""
    defs = defs if defs is not None else schema.get("$defs", {})
    if "$ref" in schema:
        return schema_instance(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, key)
    for combined in ("anyOf", "oneOf", "allOf"):
        if combined in schema:
            options = [s for s in schema[combined] if s.get("type") != "null"] or schema[combined]
            return schema_instance(options[0], defs, key)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: schema_instance(properties[name], defs, name) for name in schema.get("required", [])}
    if kind == "array":
        return [schema_instance(schema.get("items", {}), defs, key) for _ in range(schema.get("minItems", 0))]
    if kind in ("number", "integer"):
        if key == "confidence":
            return 0.9
        if "minimum" in schema:
            return schema["minimum"]
        above = schema.get("exclusiveMinimum")
        if above is None:
            return 0
        return int(above) + 1 if kind == "integer" else above + 0.5
    if kind == "boolean":
        return False
    if kind == "string":
        return REPLY if key == "reply" else "x" * int(schema.get("minLength", 0))
    return None


class StandInModel:
    """The server; ``with StandInModel(latency=4) as model: model.base_url``."""

    def __init__(self, *, latency: float = 4.0, ttft: float = 0.3, port: int = 0, host: str = "127.0.0.1") -> None:
        self.latency = latency
        self.ttft = min(ttft, latency)
        self.calls = 0
        self._lock = threading.Lock()
        handler = _handler_for(self)
        server_class = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 2048, "daemon_threads": True})
        self.httpd = server_class((host, port), handler)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="stand-in-model", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> StandInModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def count(self) -> None:
        with self._lock:
            self.calls += 1


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-stand-in",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


USAGE = {"prompt_tokens": 400, "completion_tokens": 70, "total_tokens": 470}


def _handler_for(model: StandInModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: thousands of calls
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._json({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]})
            else:
                self._json({"error": {"message": "not found"}}, status=404)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._json({"error": {"message": "the body is not JSON"}}, status=400)
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json({"error": {"message": "not found"}}, status=404)
                return
            model.count()
            started = time.monotonic()
            text = REPLY
            response_format = body.get("response_format") or {}
            if response_format.get("type") == "json_schema":
                schema = (response_format.get("json_schema") or {}).get("schema") or {}
                text = json.dumps(schema_instance(schema))
            if body.get("stream"):
                self._stream(started, text)
                return
            time.sleep(max(0.0, model.latency - (time.monotonic() - started)))
            self._json(
                {
                    "id": "chatcmpl-stand-in",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    ],
                    "usage": USAGE,
                }
            )

        def _stream(self, started: float, text: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            words = text.split(" ")
            pieces = [_chunk({"role": "assistant", "content": ""})]
            pieces += [_chunk({"content": (" " if i else "") + word}) for i, word in enumerate(words)]
            spread = max(0.0, model.latency - model.ttft) / len(words)
            try:
                time.sleep(model.ttft)
                for i, piece in enumerate(pieces):
                    if i > 1:
                        time.sleep(max(0.0, started + model.ttft + spread * (i - 1) - time.monotonic()))
                    self._event(piece)
                self._event(_chunk({}, finish="stop"))
                self._event({**_chunk({}), "choices": [], "usage": USAGE})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):  # the client went away: nothing to finish
                pass
            self.close_connection = True

        def _event(self, payload: dict[str, Any]) -> None:
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

        def _json(self, payload: dict[str, Any], *, status: int = 200) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stand_in_model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--latency", type=float, default=4.0, help="seconds per call")
    parser.add_argument("--ttft", type=float, default=0.3, help="seconds to a stream's first word")
    args = parser.parse_args(argv)
    with StandInModel(latency=args.latency, ttft=args.ttft, port=args.port, host=args.host) as model:
        print(f"stand-in model at {model.base_url} ({args.latency:g} s a call); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
