"""Disk cache of embeddings for the memory benchmarks, keyed by model name and text hash.

Embedding LoCoMo's ~5.9k turns with MiniLM takes minutes on two cores; reruns read them from
``.data/bench-cache/<model>.npz`` instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from memory.embedding import Embedder

CACHE_DIR = Path(__file__).resolve().parent.parent / ".data" / "bench-cache"


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def cached_embed(embedder: Embedder, texts: list[str], *, progress: bool = True) -> np.ndarray:
    """Vectors of ``texts`` (rows, float32), computing only those not cached yet."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    path = CACHE_DIR / f"{embedder.name.replace('/', '_').replace(':', '_')}.npz"
    cache: dict[str, np.ndarray] = {}
    if path.exists():
        data = np.load(path)
        cache = dict(zip(data["keys"].tolist(), data["vectors"], strict=True))
    keys = [_key(t) for t in texts]
    missing = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in cache}.items())
    if missing:
        batch = 256
        iterator: Iterable[int] = range(0, len(missing), batch)
        if progress:
            from rich.progress import track

            iterator = track(iterator, description=f"embedding {len(missing)} texts with {embedder.name}")
        for start in iterator:
            chunk = missing[start : start + batch]
            vectors = embedder.embed([t for _, t in chunk])
            for (k, _), v in zip(chunk, vectors, strict=True):
                cache[k] = np.asarray(v, dtype=np.float32)
        all_keys = list(cache)
        np.savez(path, keys=np.array(all_keys), vectors=np.stack([cache[k] for k in all_keys]))
    return np.stack([cache[k] for k in keys]) if keys else np.zeros((0, embedder.dimensions), dtype=np.float32)
