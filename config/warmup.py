"""Load the embedding model in the background when a server or worker process starts.

The sentence-transformers model takes 20–40 s to load on a small machine. Loading it lazily on the
first request would make that request (or the first memory task) wait that long; loading it in a
background thread as each process starts lets the process serve meanwhile (requests that need the
model before it is ready wait on the same lock instead of loading it twice).
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger(__name__)


def warm_up_in_background() -> threading.Thread | None:
    from django.conf import settings

    if settings.EMBEDDING_BACKEND != "sentence-transformers":
        return None

    def load() -> None:
        try:
            from memory.embedding import get_embedder

            get_embedder().embed(["warm-up"])
            logger.info("embedding model loaded")
        except Exception:  # a failed warm-up is retried by the first real use
            logger.exception("embedding model warm-up failed")

    thread = threading.Thread(target=load, name="embedder-warm-up", daemon=True)
    thread.start()
    return thread
