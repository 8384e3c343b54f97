"""The embedding model, loaded once per machine and served to the app's other processes over a Unix socket.

``make run`` starts it (``manage.py serve_embeddings``) and gives every web, Celery and turn-worker process
``EMBEDDING_SERVICE_SOCKET``: they embed through ``memory.embedding.ServiceEmbedder`` and never import torch,
so the model's ~550 MB are held once instead of once per process (docs/architecture.md, "One model per
machine"). The protocol is two requests over HTTP/1.1 on the socket:

- ``GET /ready``: 200 once the model is loaded, else 503.
- ``POST /embed`` with ``{"texts": [...], "query": bool}``: the vectors as little-endian float32, one row of
  384 per text, in order. Queries go through the same batching thread as in any process
  (``memory.embedding.embed_query_soon``): queries that arrive together from many processes share one forward
  pass. Documents (memory writes) are embedded one request at a time, each with every core.

Only the socket's owner may connect (mode 0600): it is a local door, not a network one.
"""

from __future__ import annotations

import json
import logging
import os
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import numpy as np

from memory.embedding import Embedder, SentenceTransformerEmbedder, embed_query_soon

logger = logging.getLogger(__name__)

# A request's texts at most (a memory write embeds tens; the service is not a bulk door).
MAX_TEXTS = 512
MAX_BODY_BYTES = 8 * 1024 * 1024


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    embedder: Embedder
    request_queue_size = 256  # every thread of every process may ask at once under load

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up before its answer (its wait ran out while this service was stopped or busy) is
        not an error of the service: a line at debug level, not a traceback per request."""
        error = sys.exc_info()[1]
        if isinstance(error, (BrokenPipeError, ConnectionResetError)):
            logger.debug("embedding service: a client left before its answer (%s)", type(error).__name__)
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: each process keeps its connection
    server: Any
    documents_lock = threading.Lock()

    def address_string(self) -> str:  # a Unix socket's peer has no address
        return "local"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("embedding service: " + format, *args)

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path != "/ready":
            self._send(404, b"unknown path")
            return
        embedder = self.server.embedder
        loaded = not isinstance(embedder, SentenceTransformerEmbedder) or embedder.loaded
        self._send(200 if loaded else 503, b"ready" if loaded else b"loading the model")

    def do_POST(self) -> None:
        if self.path != "/embed":
            self._send(404, b"unknown path")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY_BYTES:
            self._send(413 if length > 0 else 400, b"a JSON body of at most 8 MB is needed")
            return
        try:
            payload = json.loads(self.rfile.read(length))
            texts = payload["texts"]
            query = bool(payload.get("query", False))
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts) or len(texts) > MAX_TEXTS:
                raise ValueError(f"texts must be a list of at most {MAX_TEXTS} strings")
        except (ValueError, KeyError, TypeError) as exc:
            self._send(400, f"bad request: {exc}".encode())
            return
        try:
            vectors = self._embed(texts, query=query)
        except Exception as exc:  # the caller gets the error; the service goes on
            logger.exception("embedding failed")
            self._send(500, f"embedding failed: {exc}".encode())
            return
        body = np.asarray(vectors, dtype="<f4").reshape(len(texts), -1).tobytes()
        self._send(200, body, "application/octet-stream")

    def _embed(self, texts: list[str], *, query: bool) -> list[list[float]]:
        embedder = self.server.embedder
        if query:
            futures = [embed_query_soon(text, embedder=embedder) for text in texts]
            return [future.result() for future in futures]
        with self.documents_lock:
            return embedder.embed(texts)


def bind(socket_path: Path, embedder: Embedder | None = None) -> _Server:
    """The service bound to ``socket_path`` (``serve_forever()`` answers), its model loading in the background.
    ``embedder``: the model to serve (default: all-MiniLM-L6-v2 loaded in this process)."""
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    socket_path.unlink(missing_ok=True)  # a socket left by a service that was killed
    old_umask = os.umask(0o177)  # the socket is created 0600: the owner's processes only
    try:
        server = _Server(str(socket_path), _Handler)
    finally:
        os.umask(old_umask)
    model = embedder or SentenceTransformerEmbedder()
    server.embedder = model
    threading.Thread(target=lambda: model.embed(["warm-up"]), name="load-model", daemon=True).start()
    return server


def serve(socket_path: Path, embedder: Embedder | None = None) -> None:
    """Load the model (or ``embedder``), then answer on ``socket_path`` until the process is stopped."""
    server = bind(socket_path, embedder)
    logger.info("embedding service on %s", socket_path)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        socket_path.unlink(missing_ok=True)
