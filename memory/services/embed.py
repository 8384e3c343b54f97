"""The embeddings of memory writes: texts embedded with the process's embedder, computed outside any transaction."""

from __future__ import annotations

from core.db import release_connection
from memory.embedding import get_embedder


def embed_texts(texts: list[str]) -> tuple[list[list[float]], str]:
    """The texts' vectors and the embedder's name. Outside a transaction this thread's database connection goes
    back first: a write waiting on a stalled embedder holds none (a worker's other tasks, and its heartbeat, need
    them)."""
    embedder = get_embedder()
    release_connection()
    return embedder.embed(texts), embedder.name


def embed_text(text: str) -> tuple[list[float], str]:
    [vector], model_name = embed_texts([text])
    return vector, model_name
