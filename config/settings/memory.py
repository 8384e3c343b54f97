"""Embeddings and memory retrieval."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from core.env import env_float, env_int, env_str

EMBEDDING_BACKEND = env_str("EMBEDDING_BACKEND", "sentence-transformers") or "sentence-transformers"
EMBEDDING_DIMENSIONS = env_int("EMBEDDING_DIMENSIONS", 384, minimum=8)
# OpenAI-compatible embeddings endpoint (EMBEDDING_BACKEND=openai); the key is read from the env var named here.
EMBEDDING_BASE_URL = env_str("EMBEDDING_BASE_URL", "") or ""
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL", "") or ""
EMBEDDING_API_KEY_ENV = env_str("EMBEDDING_API_KEY_ENV", "EMBEDDING_API_KEY") or "EMBEDDING_API_KEY"
EMBEDDING_TIMEOUT = env_float("EMBEDDING_TIMEOUT", 30.0, minimum=0.1)
# How long a turn (or a search) waits for its query's vector before it searches by words and profile facts alone,
# and says so in its retrieval report: a stalled embedder slows a turn by this much, and never fails it.
EMBEDDING_QUERY_WAIT = env_float("EMBEDDING_QUERY_WAIT", 5.0, minimum=0.1, maximum=120.0)
# The local model served once per machine (memory/embedding_service.py; make run starts it): when set, the
# sentence-transformers backend asks the service on this Unix socket instead of loading the model (and torch)
# in every process. How long a caller waits for a service that does not answer (restarting) before failing.
EMBEDDING_SERVICE_SOCKET = env_str("EMBEDDING_SERVICE_SOCKET", "") or ""
EMBEDDING_SERVICE_WAIT = env_float("EMBEDDING_SERVICE_WAIT", 20.0, minimum=0.0)
# Memory retrieval: candidates per search arm, HNSW search breadth, the relevance model's time budget.
MEMORY_CANDIDATES = env_int("MEMORY_CANDIDATES", 40, minimum=1, maximum=1000)
MEMORY_VECTOR_CANDIDATES = env_int("MEMORY_VECTOR_CANDIDATES", 40, minimum=1, maximum=1000)
# At most this many from an HNSW index (histories past MEMORY_EXACT_SEARCH_MAX): each extra row of a filtered
# graph walk costs steps, where an exact search costs the same for any number (bench/memory_scale.py).
MEMORY_HNSW_CANDIDATES = env_int("MEMORY_HNSW_CANDIDATES", 24, minimum=1, maximum=1000)
MEMORY_HNSW_EF_SEARCH = env_int("MEMORY_HNSW_EF_SEARCH", 40, minimum=10, maximum=1000)
# Users with fewer memories than this get an exact vector search (their rows via the user index, every
# distance computed); bigger histories get an HNSW index of their own (the daily sync_user_indexes task,
# or `manage.py memory_user_indexes`), and the shared HNSW index until then. bench/memory_scale.py.
MEMORY_EXACT_SEARCH_MAX = env_int("MEMORY_EXACT_SEARCH_MAX", 10_000, minimum=0, maximum=10_000_000)
MEMORY_RECENT_ACTIONS = env_int("MEMORY_RECENT_ACTIONS", 3, minimum=0, maximum=50)
MEMORY_MAX_KEPT = env_int("MEMORY_MAX_KEPT", 25, minimum=1, maximum=1000)
MEMORY_RELEVANCE_TIMEOUT = env_float("MEMORY_RELEVANCE_TIMEOUT", 4.0, minimum=0.1)
# How a configured cheap model judges the best candidates in one call: "rerank" orders the ones that help
# (listwise; what it leaves out is judged by the calibrated filter, below its picks), "scores" scores each.
MEMORY_MODEL_JUDGE = env_str("MEMORY_MODEL_JUDGE", "rerank")
if MEMORY_MODEL_JUDGE not in ("rerank", "scores"):
    raise ImproperlyConfigured(f"MEMORY_MODEL_JUDGE must be 'rerank' or 'scores', not {MEMORY_MODEL_JUDGE!r}")
# A new fact that contradicts a current one is applied at or above this confidence, else queued for review.
MEMORY_CONTRADICTION_CONFIDENCE = env_float("MEMORY_CONTRADICTION_CONFIDENCE", 0.75, minimum=0.0, maximum=1.0)
