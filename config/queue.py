"""Sending background tasks by name.

The services and the turn send their tasks by name: a task module is a door (it calls the services), and
the layers below the doors never import one (``make lint`` checks the layers).

Celery finds the task modules by importing them (``autodiscover_tasks``), and its discovery is not safe
between threads: while one thread imports the modules, a second one's discovery returns at once, having
imported nothing (celery.loaders.base ``_RACE_PROTECTION``). A process therefore imports them once, under
a lock (``tasks_import``): at start-up (``config.warmup.process_prepare``), or, in a process that did not,
on the first ``enqueue``, the other threads waiting for that one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import current_app

from config.services import task_send_failure_record

logger = logging.getLogger(__name__)

_imported = False
_import_lock = threading.Lock()


def tasks_import() -> None:
    """Import every task module of the app, once per process; a second caller waits for the first."""
    global _imported
    if _imported:
        return
    with _import_lock:
        if not _imported:
            current_app._get_current_object().loader.import_default_modules()
            _imported = True


def enqueue(name: str, *args: Any) -> Any:
    """Send the task registered as ``name`` with ``args`` (``task.delay``: the app's broker, queue and
    eager setting apply). An unknown name is a ``LookupError``, raised only once the task modules are
    imported (``tasks_import``). Every failure to send is counted (``/metrics``: agent_task_enqueue_failures)
    before it is raised."""
    try:
        app = current_app._get_current_object()
        task = app.tasks.get(name)
        if task is None:
            tasks_import()
            task = app.tasks.get(name)
        if task is None:
            raise LookupError(f"no Celery task is registered as {name!r}")
        return task.delay(*args)
    except Exception as exc:
        _count_failure(name, exc)
        raise


def _count_failure(name: str, exc: BaseException) -> None:
    try:
        task_send_failure_record(task=name, error=f"{type(exc).__name__}: {exc}")
    except Exception:  # the count is for operators; the caller logs the failure itself
        logger.warning("could not count the failed enqueue of %s", name, exc_info=True)
