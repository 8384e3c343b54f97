"""Sending background tasks by name.

The services and the turn send their tasks by name: a task module is a door (it calls the services), and
the layers below the doors never import one (``make lint`` checks the layers).

Celery finds the task modules by importing them (``autodiscover_tasks``), and its discovery is not safe
between threads: while one thread imports the modules, a second one's discovery returns at once, having
imported nothing (celery.loaders.base ``_RACE_PROTECTION``). A process therefore imports them once, under
a lock (``tasks_import``): at start-up (``web.warmup.process_prepare``), or, in a process that did not,
on the first ``enqueue``, the other threads waiting for that one.
"""

from __future__ import annotations

import ast
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis
from celery import current_app

from core.services import task_send_failure_record
from core.task_names import with_former

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
            loader = current_app._get_current_object().loader
            # A Celery worker imported them as it initialised (its pool processes inherit them). Importing again
            # would run Django's set-up again through Celery's fixup, and with it the logging configuration,
            # which silences the worker's own loggers (its task results).
            if not getattr(loader, "worker_initialized", False):
                loader.import_default_modules()
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


# --- the queue as operators see it --------------------------------------------------------------------
@dataclass(frozen=True)
class QueueStats:
    queue: str
    depth: int  # tasks waiting, not yet taken by a worker
    oldest_seconds: float | None  # how long the next one to be taken has waited (None: empty, or not known)


def _redis_url(broker_url: str) -> str | None:
    """A redis-py URL for a kombu Redis broker URL (``redis+socket:///path`` is ``unix:///path``); else None."""
    if broker_url.startswith("redis+socket://"):
        return "unix://" + broker_url.removeprefix("redis+socket://")
    if broker_url.startswith(("redis://", "rediss://")):
        return broker_url
    return None


def _broker_client(broker_url: str | None, timeout: float) -> redis.Redis | None:
    """A client of the app's broker (or of ``broker_url``) that gives up after ``timeout`` seconds; None when the
    broker is not a Redis-protocol one."""
    url = _redis_url(broker_url or str(current_app._get_current_object().conf.broker_url))
    return None if url is None else redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def queue_stats(*, broker_url: str | None = None, queue: str | None = None, timeout: float = 1.0) -> QueueStats | None:
    """How many tasks wait in ``queue`` (the default one) and for how long the oldest has, on a Redis-protocol
    broker (the embedded one, or Redis); None on another transport. The age comes from the ``sent_at`` header
    every task carries (``config/celery.py``). Raises the client's error when the broker does not answer within
    ``timeout`` seconds."""
    client = _broker_client(broker_url, timeout)
    if client is None:
        return None
    name = queue or str(current_app._get_current_object().conf.task_default_queue)
    try:
        # kombu's Redis transport pushes on the left and takes from the right; priorities other than the
        # default go to keys of their own (the name, "\x06\x16", the priority).
        keys = [name, *(f"{name}\x06\x16{p}" for p in (3, 6, 9))]
        depth = sum(int(client.llen(key)) for key in keys)
        oldest: float | None = None
        raw = client.lindex(name, -1)
        if raw is not None:
            try:
                oldest = max(0.0, time.time() - float(json.loads(raw)["headers"]["sent_at"]))
            except (ValueError, KeyError, TypeError):  # a message from before the header (or not Celery's)
                oldest = None
        return QueueStats(queue=name, depth=depth, oldest_seconds=oldest)
    finally:
        client.close()


def queues_stats(*, timeout: float = 1.0) -> list[QueueStats] | None:
    """``queue_stats`` of the default queue and of its operations queue (``<queue>-ops``: beat's tasks and turn
    recovery); None on a broker that is not a Redis-protocol one."""
    default = str(current_app._get_current_object().conf.task_default_queue)
    found = [queue_stats(queue=name, timeout=timeout) for name in (default, f"{default}-ops")]
    known = [stats for stats in found if stats is not None]
    return known if len(known) == len(found) else None


def queued_args(
    name: str, *, queue: str | None = None, limit: int = 100_000, timeout: float = 2.0
) -> set[tuple[Any, ...]] | None:
    """The arguments of every task ``name`` (or a message under its former name) waiting in ``queue`` (the default
    one unless given; at most ``limit`` messages read), on a Redis-protocol broker; None on another transport or when the broker does not answer: then
    nothing is known to be queued. The outbox sweeps skip what is in it (a backlog is not lost work); the turn
    sweep tells a turn still waiting for a worker from one whose task was lost."""
    client = _broker_client(None, timeout)
    if client is None:
        return None
    found: set[tuple[Any, ...]] = set()
    names = with_former(name)
    name_of_queue = queue or str(current_app._get_current_object().conf.task_default_queue)
    try:
        # (Priorities other than the default go to keys of their own: see queue_stats.)
        raws = [
            raw
            for key in (name_of_queue, *(f"{name_of_queue}\x06\x16{p}" for p in (3, 6, 9)))
            for raw in client.lrange(key, 0, limit - 1)
        ]
        for raw in raws:
            try:
                headers = json.loads(raw)["headers"]
                if headers.get("task") in names:
                    found.add(tuple(ast.literal_eval(headers["argsrepr"])))
            except (ValueError, KeyError, TypeError, SyntaxError):  # not a message of ours
                continue
    except redis.RedisError:
        logger.warning("could not read the queue to skip what is queued", exc_info=True)
        return None
    finally:
        client.close()
    return found
