from __future__ import annotations

import os
from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created

from llm.demo import register_structured_handler
from memory.demo_facts import extract_facts_demo
from memory.schemas import ExtractedFacts


class MemoryConfig(AppConfig):
    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The offline demo model answers fact extraction with a deterministic handler, so a fresh
        # install shows semantic memories without an LLM.
        register_structured_handler(ExtractedFacts, extract_facts_demo)
        connection_created.connect(hnsw_settings_apply, dispatch_uid="memory.hnsw_settings")

        blas_single_thread()


def blas_single_thread() -> None:
    """One thread for numpy's BLAS in this process.

    Retrieval scores its candidates' pairs in one small matrix product (``memory.retrieval.vector.crowding``, about
    80 x 384). OpenBLAS starts a thread per core for it, and its threads keep spinning for a while after each
    product, on the cores PostgreSQL and the other requests need: at the 1M scale (2 cores) that raised the
    p99 of tier 1, which does no maths, from 2.2 to 4.9 ms (docs/memory.md, Scale). One thread computes
    such a product as fast. The embedder's model (torch) keeps its own threads (OpenMP, not BLAS).

    The limit reaches the OpenBLAS loaded now (numpy's); the environment variable, any loaded later (scipy's,
    which sentence-transformers brings), unless the environment already says otherwise.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy  # noqa: F401 - loads OpenBLAS, so that the limit below finds it
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def hnsw_settings_apply(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Set pgvector's search options once per database connection (not once per query).

    ``hnsw.iterative_scan = relaxed_order`` (pgvector 0.8): a filtered HNSW scan keeps walking the
    graph until the LIMIT is met, so the user filter cannot starve the result. Set before the vector
    library is loaded in this backend, they are placeholders that it adopts when it loads.
    """
    from django.conf import settings

    if connection.vendor != "postgresql" or getattr(settings, "DATABASE_TRANSACTION_POOLER", False):
        return  # behind a transaction pooler a session's settings reach other clients: set them on the role

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', false), set_config('hnsw.ef_search', %s, false)",
            [str(int(settings.MEMORY_HNSW_EF_SEARCH))],
        )
