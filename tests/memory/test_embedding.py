from __future__ import annotations

import math
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from conftest import wait_for
from memory.embedding import Embedder, HashingEmbedder, get_embedder
from memory.models import Memory
from memory.services import memory_create


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _conformance(embedder: Embedder) -> None:
    texts = ["I live in Lisbon near the river", "Where do I live? Lisbon, by the river", "Quarterly tax forms"]
    vectors = embedder.embed(texts)
    assert len(vectors) == 3 and all(len(v) == embedder.dimensions for v in vectors)
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4) for v in vectors)
    assert _cos(vectors[0], vectors[1]) > _cos(vectors[0], vectors[2])
    assert embedder.embed_query(texts[0]) == pytest.approx(vectors[0], abs=1e-5)
    assert embedder.embed([]) == []


def test_hashing_embedder_conformance_and_determinism() -> None:
    embedder = HashingEmbedder(384)
    _conformance(embedder)
    assert embedder.embed(["same text"]) == HashingEmbedder(384).embed(["same text"])
    assert len(embedder.embed_query("the a of")) == 384  # stop words only: still a unit vector


def test_tests_use_the_hashing_embedder() -> None:
    assert get_embedder().name == "hashing-384"


@pytest.mark.real_embedder
def test_real_sentence_transformer_embedder() -> None:
    embedder = get_embedder()
    assert embedder.name == "all-MiniLM-L6-v2"
    _conformance(embedder)
    # Meaning, not just words: a paraphrase with no word in common is near.
    a, b, c = embedder.embed(["The flight was cancelled", "My plane trip got called off", "Tomatoes need sun"])
    assert _cos(a, b) > 0.4 > _cos(a, c)


@pytest.mark.django_db
def test_reembed_command_updates_stale_memories(alice: Any, settings: Any) -> None:
    memory = memory_create(user=alice, kind="episodic", text="User: I like hiking")
    Memory.objects.filter(pk=memory.pk).update(embedding_model="old-model", embedding=[0.0] * 383 + [1.0])
    out = StringIO()
    call_command("reembed_memories", stdout=out)
    memory.refresh_from_db()
    assert memory.embedding_model == "hashing-384"
    assert list(memory.embedding) == pytest.approx(get_embedder().embed(["User: I like hiking"])[0], abs=1e-6)
    assert "Re-embedded 1 memories" in out.getvalue()
    out = StringIO()
    call_command("reembed_memories", stdout=out)
    assert "Nothing to re-embed" in out.getvalue()


def test_query_embedding_soon_gives_the_same_vector_and_its_errors() -> None:
    from memory.embedding import embed_query_soon

    assert embed_query_soon("I live in Lisbon").result() == get_embedder().embed_query("I live in Lisbon")

    class Broken(HashingEmbedder):
        def embed_query(self, text: str) -> list[float]:
            raise RuntimeError("embedding service down")

    from memory.embedding import registry

    registry._instances["broken"] = Broken(384)
    try:
        future = embed_query_soon("anything", backend="broken")
        with pytest.raises(RuntimeError, match="embedding service down"):
            future.result()
    finally:
        del registry._instances["broken"]


@pytest.mark.real_embedder
def test_real_query_embeddings_run_on_a_one_thread_worker_and_leave_the_caller_alone() -> None:
    import threading

    import torch

    from memory.embedding import embed_query_soon

    embedder = get_embedder()
    callers_threads = torch.get_num_threads()
    seen: dict[str, Any] = {}
    real = embedder.embed_query

    def spy(text: str) -> list[float]:
        seen["thread"] = threading.current_thread().name
        seen["torch_threads"] = torch.get_num_threads()
        return real(text)

    embedder.embed_query = spy  # type: ignore[method-assign]
    try:
        vector = embed_query_soon("The flight was cancelled").result(timeout=60)
    finally:
        del embedder.embed_query  # type: ignore[method-assign]
    assert vector == pytest.approx(embedder.embed_query("The flight was cancelled"), abs=1e-5)
    assert seen["thread"].startswith("embed-query") and seen["torch_threads"] == 1
    assert torch.get_num_threads() == callers_threads  # per thread: batch embedding keeps every core


def test_a_query_embedded_lately_is_answered_from_the_process_cache(monkeypatch: Any) -> None:
    """``embed_query_soon`` keeps the latest query vectors (LRU): the same query again skips the model."""
    from memory.embedding import queries, registry

    class Counting:
        name, dimensions = "counting", 3

        def __init__(self) -> None:
            self.calls: list[str] = []

        def embed(self, texts: list[str]) -> list[list[float]]:
            return [self.embed_query(t) for t in texts]

        def embed_query(self, text: str) -> list[float]:
            self.calls.append(text)
            return [float(len(text)), 0.0, 1.0]

    model = Counting()
    monkeypatch.setitem(registry._instances, "counting", model)
    monkeypatch.setattr(queries, "QUERY_CACHE_SIZE", 2)
    monkeypatch.setattr(queries, "_query_cache", queries.OrderedDict())
    first = queries.embed_query_soon("trains to Porto", backend="counting").result()
    again = queries.embed_query_soon("trains to Porto", backend="counting").result()
    assert first == again == [15.0, 0.0, 1.0] and model.calls == ["trains to Porto"]
    again.append(9.0)  # a caller's copy: changing it changes nothing cached
    assert queries.embed_query_soon("trains to Porto", backend="counting").result() == first
    queries.embed_query_soon("b", backend="counting").result()
    queries.embed_query_soon("c", backend="counting").result()  # the oldest goes: two at most
    queries.embed_query_soon("trains to Porto", backend="counting").result()
    assert model.calls == ["trains to Porto", "b", "c", "trains to Porto"]


def test_queries_that_wait_together_are_embedded_in_one_batch(monkeypatch: Any) -> None:
    """While the query thread embeds one query, the others that arrive wait and then go in one call: several
    turns embedding at once share a forward pass. Each caller gets its own vector, the same text is embedded
    once, and an error reaches every caller of its batch."""
    import threading

    from memory.embedding import queries, registry

    class Gated:
        name, dimensions = "gated", 3

        def __init__(self) -> None:
            self.batches: list[list[str]] = []
            self.gate = threading.Event()
            self.fail = False

        def embed(self, texts: list[str]) -> list[list[float]]:
            raise AssertionError("queries go through embed_queries")

        def embed_query(self, text: str) -> list[float]:
            raise AssertionError("queries go through embed_queries")

        def embed_queries(self, texts: list[str]) -> list[list[float]]:
            self.batches.append(list(texts))
            self.gate.wait(10)
            if self.fail:
                raise RuntimeError("embedding service down")
            if any("too long" in t for t in texts):
                raise ValueError("input too long")
            if any("short" in t for t in texts):
                return [[1.0, 1.0, 1.0] for _ in texts][1:]  # a vector short: an error, not a hang
            return [[float(len(t)), 1.0, 0.0] for t in texts]

    model = Gated()
    monkeypatch.setitem(registry._instances, "gated", model)
    monkeypatch.setattr(queries, "_query_cache", queries.OrderedDict())
    first = queries.embed_query_soon("a", backend="gated")
    wait_for(lambda: model.batches, message="the first query to reach the model")
    later = {t: queries.embed_query_soon(t, backend="gated") for t in ("bb", "ccc", "dddd")}
    again = queries.embed_query_soon("ccc", backend="gated")
    model.gate.set()
    assert first.result(10) == [1.0, 1.0, 0.0]
    assert {t: f.result(10) for t, f in later.items()} == {t: [float(len(t)), 1.0, 0.0] for t in later}
    assert again.result(10) == [3.0, 1.0, 0.0]
    assert model.batches == [["a"], ["bb", "ccc", "dddd"]]
    assert queries._cached_query(("gated", "dddd")) == [4.0, 1.0, 0.0]

    model.gate.clear()
    model.fail = True
    blocked = queries.embed_query_soon("e", backend="gated")
    wait_for(lambda: len(model.batches) == 3, message="the blocking query to reach the model")
    doomed = [queries.embed_query_soon(t, backend="gated") for t in ("ff", "ggg")]
    model.gate.set()
    for future in (blocked, *doomed):
        with pytest.raises(RuntimeError, match="embedding service down"):
            future.result(10)
    model.fail = False
    assert queries.embed_query_soon("hhhhh", backend="gated").result(10) == [5.0, 1.0, 0.0]  # the thread lives on

    # One query the embedder refuses fails alone: the others of its batch are embedded one by one.
    model.gate.clear()
    blocked = queries.embed_query_soon("iiiiii", backend="gated")
    wait_for(lambda: model.batches[-1] == ["iiiiii"], message="the blocking query to reach the model")
    mixed = {t: queries.embed_query_soon(t, backend="gated") for t in ("a too long one", "jj", "kkk short")}
    model.gate.set()
    assert blocked.result(10) == [6.0, 1.0, 0.0] and mixed["jj"].result(10) == [2.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="input too long"):
        mixed["a too long one"].result(10)
    with pytest.raises(ValueError, match="returned 0 vectors for 1 queries"):
        mixed["kkk short"].result(10)


@pytest.mark.real_embedder
def test_a_batch_of_real_queries_gives_each_its_own_vector() -> None:
    embedder = get_embedder()
    texts = ["The flight was cancelled", "I live in Lisbon and love the sea", "ok"]
    batched = embedder.embed_queries(texts)  # type: ignore[attr-defined]
    for text, vector in zip(texts, batched, strict=True):
        assert vector == pytest.approx(embedder.embed_query(text), abs=1e-5)


def test_an_idle_query_thread_ends_and_lets_go_of_its_embedder(monkeypatch: Any) -> None:
    """A query thread with nothing to do for QUERY_THREAD_IDLE ends and leaves the registry (a replaced
    embedder leaves no thread behind); the next query starts a new thread and is answered, also when it got
    hold of the old thread just as that one ended."""
    from memory.embedding import queries, registry

    class Plain:
        name, dimensions = "plain-idle", 3

        def embed(self, texts: list[str]) -> list[list[float]]:
            return [self.embed_query(t) for t in texts]

        def embed_query(self, text: str) -> list[float]:
            return [float(len(text)), 0.0, 1.0]

    model = Plain()
    created: list[Any] = []
    real_batcher = queries._QueryBatcher

    def recorded(embedder: Any) -> Any:
        created.append(real_batcher(embedder))
        return created[-1]

    monkeypatch.setattr(queries, "_QueryBatcher", recorded)
    monkeypatch.setitem(registry._instances, "plain-idle", model)
    monkeypatch.setattr(queries, "_query_cache", queries.OrderedDict())
    monkeypatch.setattr(queries, "QUERY_THREAD_IDLE", 0.5)
    assert queries.embed_query_soon("one", backend="plain-idle").result(10) == [3.0, 0.0, 1.0]
    first = created[-1]  # (the last: on a stalled machine a thread may have ended before it took the query)
    before = len(created)
    first.thread.join(10)
    assert not first.thread.is_alive() and first.closed and id(model) not in queries._batchers
    assert first.submit("late", ("plain-idle", "late")) is None  # a closed thread takes no query

    # A caller that was handed the old thread just before it ended asks again and gets a new one.
    monkeypatch.setattr(queries, "QUERY_THREAD_IDLE", 300.0)
    real_for = queries._batcher_for
    handed: list[Any] = []

    def stale_first(embedder: Any) -> Any:
        handed.append(first if not handed else real_for(embedder))
        return handed[-1]

    monkeypatch.setattr(queries, "_batcher_for", stale_first)
    assert queries.embed_query_soon("three", backend="plain-idle").result(10) == [5.0, 0.0, 1.0]
    assert len(created) == before + 1 and handed == [first, created[-1]] and created[-1].thread.is_alive()
    assert queries._batchers[id(model)] is created[-1]


def test_a_query_thread_that_dies_fails_what_it_still_held(monkeypatch: Any) -> None:
    """The thread ending for good (here: its queue closed under it) fails every query still queued with a
    clear error and leaves the registry: no caller waits forever."""
    from memory.embedding import queries

    class Plain:
        name, dimensions = "plain-dies", 3

        def embed(self, texts: list[str]) -> list[list[float]]:
            return [[1.0, 0.0, 0.0] for _ in texts]

        def embed_query(self, text: str) -> list[float]:
            return [1.0, 0.0, 0.0]

    model = Plain()
    batcher = queries._QueryBatcher.__new__(queries._QueryBatcher)  # no thread: its end is driven here
    batcher.embedder = model
    batcher.waiting = queries.queue.SimpleQueue()
    batcher.closed = False
    batcher.lock = queries.threading.Lock()
    monkeypatch.setitem(queries._batchers, id(model), batcher)
    queued = [batcher.submit(t, ("plain-dies", t)) for t in ("a", "b")]
    batcher._close(KeyboardInterrupt())
    for future in queued:
        assert future is not None
        with pytest.raises(RuntimeError, match="query embedding thread ended"):
            future.result(1)
    assert id(model) not in queries._batchers and batcher.submit("c", ("plain-dies", "c")) is None
