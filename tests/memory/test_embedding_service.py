"""The embedding model served once per machine (memory/embedding_service.py) to processes that never load it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from memory import embedding
from memory.embedding import EmbeddingServiceUnavailable, SentenceTransformerEmbedder, ServiceEmbedder, registry
from memory.embedding_service import bind

pytestmark = pytest.mark.real_embedder

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model() -> SentenceTransformerEmbedder:
    local = SentenceTransformerEmbedder()
    local.embed(["load"])
    return local


@pytest.fixture
def service(tmp_path_factory: pytest.TempPathFactory, model: SentenceTransformerEmbedder) -> Iterator[Path]:
    # A short path: a Unix socket's path is limited to 107 bytes.
    path = Path(tmp_path_factory.mktemp("emb", numbered=True)) / "e.sock"
    server = bind(path, model)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()


def _client(path: Path, wait: float = 5.0) -> ServiceEmbedder:
    return ServiceEmbedder(str(path), timeout=10.0, wait=wait)


def test_the_service_gives_the_local_models_vectors_under_its_name(
    service: Path, model: SentenceTransformerEmbedder
) -> None:
    client = _client(service)
    assert client.ready()
    assert (client.name, client.dimensions) == (model.name, model.dimensions)  # the name stored on each memory
    texts = ["I live in Lisbon near the river", "Where do I live? Lisbon, by the river", "Quarterly tax forms"]
    for got, local in zip(client.embed(texts), model.embed(texts), strict=True):
        assert got == pytest.approx(local, abs=1e-5)
    assert client.embed_query(texts[1]) == pytest.approx(model.embed_query(texts[1]), abs=1e-5)
    assert client.embed([]) == []


def test_queries_from_many_threads_at_once_each_get_their_own_vector(
    service: Path, model: SentenceTransformerEmbedder
) -> None:
    client = _client(service)
    texts = [f"question {n} about the trip to city number {n * 7}" for n in range(32)]
    got: dict[str, list[float]] = {}

    def ask(text: str) -> None:
        got[text] = client.embed_query(text)

    threads = [threading.Thread(target=ask, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(got) == sorted(texts)
    for text in texts:
        assert got[text] == pytest.approx(model.embed_query(text), abs=1e-5)


def test_a_bad_request_gets_a_clear_400_and_the_service_goes_on(service: Path) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(service)), base_url="http://s") as http:
        bad = http.post("/embed", content=b"{not json")
        assert bad.status_code == 400 and "bad request" in bad.text
        wrong = http.post("/embed", json={"texts": [1, 2]})
        assert wrong.status_code == 400 and "texts" in wrong.text
        assert http.get("/nowhere").status_code == 404
    assert len(_client(service).embed_query("still answering")) == 384


def test_a_service_that_does_not_answer_is_not_ready_and_fails_clearly_in_time(tmp_path: Path) -> None:
    client = _client(tmp_path / "none.sock", wait=0.5)
    assert client.ready() is False
    started = time.monotonic()
    with pytest.raises(EmbeddingServiceUnavailable, match="did not answer within"):
        client.embed_query("anyone there?")
    assert time.monotonic() - started < 5


def test_a_service_restarted_while_a_caller_waits_answers_it(
    tmp_path_factory: pytest.TempPathFactory, model: SentenceTransformerEmbedder
) -> None:
    path = Path(tmp_path_factory.mktemp("late")) / "e.sock"
    result: dict[str, Any] = {}

    def ask() -> None:
        try:
            result["vector"] = _client(path, wait=20).embed_query("asked before the service is up")
        except Exception as exc:  # noqa: BLE001 - the assertion below says what went wrong
            result["error"] = exc

    caller = threading.Thread(target=ask)
    caller.start()
    time.sleep(1.0)  # the caller is retrying now
    server = bind(path, model)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    try:
        caller.join(timeout=30)
        assert "error" not in result, result
        assert result["vector"] == pytest.approx(model.embed_query("asked before the service is up"), abs=1e-5)
    finally:
        server.shutdown()
        server.server_close()


def test_a_process_that_uses_the_service_never_imports_torch(service: Path, model: SentenceTransformerEmbedder) -> None:
    script = (
        "import sys, django; django.setup()\n"
        "from memory.embedding import get_embedder, ServiceEmbedder\n"
        "e = get_embedder()\n"
        "v = e.embed_query('where do I live?')\n"
        "print(type(e).__name__, len(v), 'torch' in sys.modules, 'sentence_transformers' in sys.modules)\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "EMBEDDING_BACKEND": "sentence-transformers",
        "EMBEDDING_SERVICE_SOCKET": str(service),
    }
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["ServiceEmbedder", "384", "False", "False"], out.stderr[-2000:]


def test_the_settings_choose_the_service_and_readiness_asks_it(
    service: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.EMBEDDING_BACKEND = "sentence-transformers"
    settings.EMBEDDING_SERVICE_SOCKET = str(service)
    monkeypatch.setattr(registry, "_instances", {})
    assert embedding.embedder_ready() is True
    assert isinstance(embedding.get_embedder(), ServiceEmbedder)
    settings.EMBEDDING_SERVICE_SOCKET = str(service.parent / "gone.sock")
    monkeypatch.setattr(registry, "_instances", {})
    assert embedding.embedder_ready() is False
