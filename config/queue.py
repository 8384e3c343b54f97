"""Sending background tasks by name.

The services and the turn send their tasks by name: a task module is a door (it calls the services), and
the layers below the doors never import one (``make lint`` checks the layers).
"""

from __future__ import annotations

from typing import Any

from celery import current_app


def enqueue(name: str, *args: Any) -> Any:
    """Send the task registered as ``name`` with ``args`` (``task.delay``: the app's broker, queue and
    eager setting apply). The tasks modules are imported once, when the name is not registered yet (a
    web process that has sent nothing so far); an unknown name is a ``LookupError``."""
    app = current_app._get_current_object()
    task = app.tasks.get(name)
    if task is None:
        app.loader.import_default_modules()
        task = app.tasks.get(name)
    if task is None:
        raise LookupError(f"no Celery task is registered as {name!r}")
    return task.delay(*args)
