"""Load the embedding model and the tokenizer in the background when a server or worker process starts.

The sentence-transformers model takes 20–40 s to load on a small machine. Loading it lazily on the
first request would make that request (or the first memory task) wait that long; loading it in a
background thread as each process starts lets the process serve meanwhile (requests that need the
model before it is ready wait on the same lock instead of loading it twice). ``/readyz`` says when it
is done, and starts it when nothing has (a server that is not gunicorn: ``manage.py runserver``).

What is cheap to set up is set up before the process serves anything (``process_prepare``): the first burst
of requests a new process takes must not race to build it (docs/architecture.md, "Set up at start").
"""

from __future__ import annotations

import logging
import os
import threading
import time

from celery import current_app
from django.conf import settings

from agents.tools.registry import default_registry
from agents.workflows import registered_workflows
from core.embedded_broker import ensure_configured
from core.queue import tasks_import
from llm.tokens import counter_for
from memory.embedding import get_embedder

logger = logging.getLogger(__name__)

_thread: threading.Thread | None = None
_pid = 0  # the process that started _thread: a forked child starts its own
_lock = threading.Lock()


def process_prepare() -> float:
    """Set up, in this thread, what every request or turn of this process needs and is cheap to build: the
    embedded broker when the settings use it (started if no process has), the Celery task registry, the tool and workflow registries, and the broker's connection pool (not a
    connection). Called by gunicorn's ``post_worker_init``, the Celery worker's ``worker_process_init`` and
    ``manage.py mcp`` before they serve. Each part stays safe lazily too (a lock; see the closing list in
    docs/architecture.md); a part that fails is logged and left to its first use, which raises the same
    error where it can be seen. Returns the seconds it took."""
    started = time.perf_counter()
    parts = {
        "embedded broker": ensure_configured,  # when the settings use it: started by the first process to serve
        "task registry": tasks_import,
        "tool registry": default_registry,
        "workflow registry": registered_workflows,
        "broker connection pool": lambda: current_app._get_current_object().amqp.producer_pool,
    }
    for what, prepare in parts.items():
        try:
            prepare()
        except Exception:
            logger.exception("could not set up the %s at start-up; its first use will try again", what)
    took = time.perf_counter() - started
    logger.info("process set up in %.0f ms", took * 1000)
    return took


def warm_up_in_background() -> threading.Thread:
    """Start the warm-up once per process (later calls return the same thread)."""
    global _thread, _pid
    with _lock:
        if _thread is not None and _pid == os.getpid():
            return _thread

        def load() -> None:
            try:
                counter_for("").count("warm-up")
                if settings.EMBEDDING_BACKEND == "sentence-transformers":
                    get_embedder().embed(["warm-up"])
                    logger.info("embedding model loaded")
            except Exception:  # a failed warm-up is retried by the first real use
                logger.exception("warm-up failed")

        _thread, _pid = threading.Thread(target=load, name="warm-up", daemon=True), os.getpid()
        _thread.start()
        return _thread
