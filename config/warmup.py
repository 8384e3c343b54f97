"""Load the embedding model and the tokenizer in the background when a server or worker process starts.

The sentence-transformers model takes 20–40 s to load on a small machine. Loading it lazily on the
first request would make that request (or the first memory task) wait that long; loading it in a
background thread as each process starts lets the process serve meanwhile (requests that need the
model before it is ready wait on the same lock instead of loading it twice). ``/readyz`` says when it
is done, and starts it when nothing has (a server that is not gunicorn: ``manage.py runserver``).
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)

_thread: threading.Thread | None = None
_pid = 0  # the process that started _thread: a forked child starts its own
_lock = threading.Lock()


def warm_up_in_background() -> threading.Thread:
    """Start the warm-up once per process (later calls return the same thread)."""
    global _thread, _pid
    with _lock:
        if _thread is not None and _pid == os.getpid():
            return _thread

        def load() -> None:
            from django.conf import settings

            from agents.llm.tokens import counter_for

            try:
                counter_for("").count("warm-up")
                if settings.EMBEDDING_BACKEND == "sentence-transformers":
                    from memory.embedding import get_embedder

                    get_embedder().embed(["warm-up"])
                    logger.info("embedding model loaded")
            except Exception:  # a failed warm-up is retried by the first real use
                logger.exception("warm-up failed")

        _thread, _pid = threading.Thread(target=load, name="warm-up", daemon=True), os.getpid()
        _thread.start()
        return _thread
