"""Query embeddings on the request path: the embedder's query thread, which embeds the queries waiting together
in one pass (``embed_query_soon``), and the process's cache of the latest query vectors."""

from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
from collections import OrderedDict

from django.conf import settings

from memory.embedding.backends import Embedder, HashingEmbedder
from memory.embedding.registry import get_embedder

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
