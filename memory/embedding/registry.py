"""The process's embedders: the one ``settings.EMBEDDING_BACKEND`` names, built once per process and
backend, and whether it can embed without waiting for a model to load."""

from __future__ import annotations

import os
import threading

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from memory.embedding.backends import Embedder, HashingEmbedder, OpenAIEmbedder, SentenceTransformerEmbedder
from memory.embedding.service_client import ServiceEmbedder

_instances: dict[str, Embedder] = {}
_instances_lock = threading.Lock()


def _build(backend: str) -> Embedder:
    dims = int(settings.EMBEDDING_DIMENSIONS)
    if backend == "hashing":
        return HashingEmbedder(dims)
    if backend == "sentence-transformers":
        if dims != 384:
            raise ImproperlyConfigured("EMBEDDING_BACKEND=sentence-transformers needs EMBEDDING_DIMENSIONS=384")
        if settings.EMBEDDING_SERVICE_SOCKET:
            return ServiceEmbedder(
                settings.EMBEDDING_SERVICE_SOCKET,
                timeout=float(settings.EMBEDDING_TIMEOUT),
                wait=float(settings.EMBEDDING_SERVICE_WAIT),
            )
        return SentenceTransformerEmbedder()
    if backend == "openai":
        base_url = settings.EMBEDDING_BASE_URL
        model = settings.EMBEDDING_MODEL
        if not base_url or not model:
            raise ImproperlyConfigured("EMBEDDING_BACKEND=openai needs EMBEDDING_BASE_URL and EMBEDDING_MODEL")
        return OpenAIEmbedder(
            base_url=base_url,
            model=model,
            api_key=os.environ.get(settings.EMBEDDING_API_KEY_ENV, ""),
            dimensions=dims,
            timeout=float(settings.EMBEDDING_TIMEOUT),
        )
    raise ImproperlyConfigured(f"EMBEDDING_BACKEND={backend!r}: use sentence-transformers, openai or hashing")


def embedder_ready(backend: str | None = None) -> bool:
    """True when this process can embed without waiting for a model to load (never loads; waits at most half a
    second): the local model is in memory, or the embedding service answers with its model loaded; the other
    backends need nothing loaded."""
    key = backend or settings.EMBEDDING_BACKEND
    if key != "sentence-transformers":
        return True
    embedder = _instances.get(key)
    if embedder is None and settings.EMBEDDING_SERVICE_SOCKET:
        embedder = get_embedder(key)
    if isinstance(embedder, ServiceEmbedder):
        return embedder.ready()
    return isinstance(embedder, SentenceTransformerEmbedder) and embedder.loaded


_service_probe: ServiceEmbedder | None = None


def embedding_service_answers() -> bool:
    """The embedding service on ``EMBEDDING_SERVICE_SOCKET`` answers ``GET /ready`` (its model loaded) within half a
    second (``/healthz``'s embedder part). False when no service is configured."""
    global _service_probe
    socket_path = str(settings.EMBEDDING_SERVICE_SOCKET or "")
    if not socket_path:
        return False
    with _instances_lock:
        if _service_probe is None or _service_probe.socket_path != socket_path:
            _service_probe = ServiceEmbedder(socket_path, timeout=0.5, wait=0.0)
        probe = _service_probe
    return probe.ready()


def get_embedder(backend: str | None = None) -> Embedder:
    """The process-wide embedder for ``backend`` (default: ``settings.EMBEDDING_BACKEND``), built once."""
    key = backend or settings.EMBEDDING_BACKEND
    embedder = _instances.get(key)
    if embedder is None:
        with _instances_lock:
            embedder = _instances.get(key)
            if embedder is None:
                embedder = _build(key)
                _instances[key] = embedder
    return embedder
