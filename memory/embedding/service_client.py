"""The client of the embedding service (``memory.embedding_service``): the local model asked over its Unix
socket, so that a process never imports torch. httpx, numpy and tenacity are imported when it is asked."""

from __future__ import annotations

import threading
from typing import Any


class ServiceEmbedder:
    """The local model, served once per machine: all-MiniLM-L6-v2 asked of the embedding service over its Unix
    socket (``memory.embedding_service``; ``make run`` starts it and sets ``EMBEDDING_SERVICE_SOCKET`` for its
    other processes). The same vectors under the same name as ``SentenceTransformerEmbedder``, and this process
    never imports torch: each web, Celery and turn-worker process stays ~150 MB instead of ~700 MB.

    A service that does not answer (restarting under ``make run``'s supervisor) is asked again with backoff
    for up to ``EMBEDDING_SERVICE_WAIT`` seconds; then the caller gets ``EmbeddingServiceUnavailable``.
    """

    def __init__(self, socket_path: str, *, timeout: float, wait: float) -> None:
        self.name = "all-MiniLM-L6-v2"  # the model's name, as the local embedder stores it on each memory
        self.dimensions = 384
        self.socket_path = socket_path
        self._timeout = timeout
        self._wait = wait
        self._client: Any = None
        self._lock = threading.Lock()

    def _http(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import httpx

                    self._client = httpx.Client(
                        transport=httpx.HTTPTransport(uds=self.socket_path),
                        base_url="http://embedding-service",
                        timeout=self._timeout,
                    )
        return self._client

    def ready(self) -> bool:
        """The service answers and its model is loaded (never waits more than half a second)."""
        try:
            return bool(self._http().get("/ready", timeout=0.5).status_code == 200)
        except Exception:  # noqa: BLE001 - any failure to answer is "not ready"
            return False

    def _ask(self, texts: list[str], *, query: bool) -> list[list[float]]:
        if not texts:
            return []
        import httpx
        import numpy as np
        from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

        try:
            for attempt in Retrying(
                retry=retry_if_exception_type(httpx.TransportError),
                stop=stop_after_delay(self._wait),
                wait=wait_exponential(multiplier=0.1, max=2.0),
                reraise=True,
            ):
                with attempt:
                    response = self._http().post("/embed", json={"texts": texts, "query": query})
        except httpx.TransportError as exc:
            raise EmbeddingServiceUnavailable(
                f"the embedding service at {self.socket_path} did not answer within {self._wait:.0f} s: {exc}"
            ) from exc
        if response.status_code != 200:
            raise EmbeddingServiceUnavailable(f"the embedding service answered {response.status_code}: {response.text}")
        vectors = np.frombuffer(response.content, dtype="<f4")
        if vectors.size != len(texts) * self.dimensions:
            raise EmbeddingServiceUnavailable(
                f"the embedding service sent {vectors.size} numbers for {len(texts)} texts of {self.dimensions}"
            )
        return [[float(x) for x in row] for row in vectors.reshape(len(texts), self.dimensions)]

    def embed(self, texts: list[str]) -> list[list[float]]:
        return self._ask(texts, query=False)

    def embed_query(self, text: str) -> list[float]:
        return self._ask([text], query=True)[0]

    def embed_queries(self, texts: list[str]) -> list[list[float]]:
        return self._ask(texts, query=True)


class EmbeddingServiceUnavailable(RuntimeError):
    """The embedding service did not answer in time, or answered with an error."""
