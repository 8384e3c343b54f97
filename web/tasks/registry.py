"""How a task is declared: named for its module path, also under the name it had before, its options shared.

``background_task`` registers a function as a Celery task named ``<module>.<function>`` (Celery's own default:
a task's name leads to its code) and, for one release, a second time under the name it had before
(``core.task_names.FORMERLY``), with the same options: a message queued by an older deployment runs once, as it
would have. The option blocks several tasks share are declared once here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from celery import shared_task
from celery.app.task import Task
from django.db import OperationalError

from core.task_names import FORMERLY

F = TypeVar("F", bound=Callable[..., Any])

# Every task is acknowledged when it ends (CELERY_TASK_ACKS_LATE) and keeps no result (CELERY_TASK_IGNORE_RESULT):
# a worker that dies hands back what it held, and nothing waits on a result store.

# A sweep of an outbox (beat, every few minutes): background work whose enqueue was lost while the broker was
# down is sent again. A database that is restarting is waited out for a few tries; the next sweep comes anyway.
OUTBOX_SWEEP: dict[str, Any] = {
    "autoretry_for": (OperationalError,),
    "retry_backoff": 5,
    "retry_backoff_max": 120,
    "retry_jitter": True,
    "max_retries": 3,
    "soft_time_limit": 60,
    "time_limit": 90,
}

# A write a finished turn asked for (its memories, its session's summary): idempotent, retried with backoff.
TURN_AFTERMATH: dict[str, Any] = {
    "retry_backoff": 2,
    "retry_jitter": True,
    "max_retries": 5,
    "soft_time_limit": 90,
    "time_limit": 120,
}


def background_task(**options: Any) -> Callable[[F], Task]:
    """Register the function as a task named for its module path, and under its former name (same options)."""

    def register(function: F) -> Task:
        name = f"{function.__module__}.{function.__name__}"
        if name not in FORMERLY:
            raise LookupError(f"{name} is not in core.task_names: the layers below send tasks by those names")
        shared_task(name=FORMERLY[name], **options)(function)
        task: Task = shared_task(name=name, **options)(function)
        return task

    return register
