"""The run channel: a turn's events, readable by any process, from any point, for a while after it ends.

Each run has one Redis stream (``XADD``; the embedded Valkey by default, ``REDIS_URL`` or the broker's Redis
in production): the worker running the turn appends its events (deltas, tools, state, done), and every web
process reads them (``XREAD BLOCK``) from the start or from the id a client last saw (SSE ``Last-Event-ID``):
a dropped client comes back and gets the rest, a second tab gets the same events, and no event needs the
process that accepted the message. A stream is kept ``RUN_EVENTS_KEEP_SECONDS`` after its last event.

``RunChannel`` has a blocking client for threads and an asyncio one for the ASGI doors, each one per
process with a connection pool (an async reader holds a connection while it waits, not a thread).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

logger = logging.getLogger(__name__)

# An event with this type ends a run's stream (a reader stops after it).
FINAL_TYPES = frozenset({"done", "error"})
# What ``follow`` yields after each quiet wait (``RUN_EVENTS_KEEPALIVE_SECONDS``) with nothing else to say: never
# stored on the channel; the SSE doors send it as a comment, so that a stream waiting on a turn is never silent.
KEEPALIVE = "keepalive"


def channel_url() -> str | None:
    """The Redis-protocol server of the run channel: ``RUN_EVENTS_URL``, else ``REDIS_URL``, else the broker when
    it is a Redis-protocol one (the embedded Valkey by default); None when there is none."""
    url = str(getattr(settings, "RUN_EVENTS_URL", "") or getattr(settings, "REDIS_URL", "") or "")
    if not url:
        url = str(getattr(settings, "CELERY_BROKER_URL", "") or "")
    if url.startswith("redis+socket://"):
        return "unix://" + url.removeprefix("redis+socket://")
    if url.startswith(("redis://", "rediss://", "unix://")):
        return url
    return None


def stream_key(run: str | int) -> str:
    """A run's stream, named under ``RUN_EVENTS_PREFIX`` (the deployment's queue by default): two deployments, or
    two test runs whose turn ids both start at 1, that share a Redis never read each other's runs."""
    return f"{_prefix()}:run:{run}:events"


def _prefix() -> str:
    return str(getattr(settings, "RUN_EVENTS_PREFIX", "") or settings.CELERY_TASK_DEFAULT_QUEUE)


def _entry_id(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


# A read waits up to _BLOCK seconds (a run's, RUN_EVENTS_KEEPALIVE_SECONDS) for an event; the socket gives up well after that (redis-py's default, 5 s,
# would cut every quiet wait short). A reader retries a failed read for up to _RETRY_FOR seconds.
_BLOCK = 15.0
_READ_TIMEOUT = 60.0 + 15.0  # past the longest quiet wait (RUN_EVENTS_KEEPALIVE_SECONDS is at most 60)
_RETRY_FOR = 30.0
_sync_clients: dict[str, redis.Redis] = {}
_async_clients: dict[tuple[str, int], aioredis.Redis] = {}
_clients_lock = threading.Lock()


# Two numbers below 2^64 (a Redis stream id), in ASCII digits: at most 19 each keeps every one below it (a channel's
# ids are a time in milliseconds, 13 digits, and a count) and is what the API's schema says (``EVENT_ID_PATTERN``).
EVENT_ID_PATTERN = "^[0-9]{1,19}-[0-9]{1,19}$"
_EVENT_ID = re.compile(EVENT_ID_PATTERN)


def is_event_id(text: str) -> bool:
    """Whether ``text`` is an id the run channel could have given (a Redis stream id: two numbers below 2^64)."""
    return _EVENT_ID.fullmatch(text) is not None


def _client(url: str | None = None) -> redis.Redis:
    url = url or _channel_url_required()
    with _clients_lock:
        client = _sync_clients.get(url)
        if client is None:
            client = _sync_clients[url] = redis.Redis.from_url(url, **_client_options(max_connections=1024))
    return client


def _async_client() -> aioredis.Redis:
    """One asyncio client per process and event loop (a client's connections belong to one loop)."""
    url = _channel_url_required()
    key = (url, id(asyncio.get_running_loop()))
    with _clients_lock:
        client = _async_clients.get(key)
        if client is None:
            client = _async_clients[key] = aioredis.Redis.from_url(url, **_client_options(max_connections=4096))
    return client


def _channel_url_required() -> str:
    url = channel_url()
    if url is None:
        raise RuntimeError("The run channel needs a Redis-protocol server: set REDIS_URL (or RUN_EVENTS_URL).")
    return url


def _client_options(*, max_connections: int) -> dict[str, Any]:
    return {
        "socket_connect_timeout": 5,
        "socket_timeout": _READ_TIMEOUT,
        "health_check_interval": 30,
        "max_connections": max_connections,
    }


def _keep_seconds() -> int:
    return int(getattr(settings, "RUN_EVENTS_KEEP_SECONDS", 3600))


def session_key(session_id: Any) -> str:
    """A session's change signals: an entry whenever something a chat page shows may have changed (a turn ended,
    a staff reply, a hand-off or hand-back, the session deleted). The page reads what changed from the database."""
    return f"{_prefix()}:session:{session_id}:changes"


# A session's signal stream keeps its last few entries: a reader needs only "something came after my id".
_SESSION_KEEP = 20


def session_changed(session_id: Any) -> None:
    """Wake the session's open chat pages (``session_wait``), soon, never failing the caller: without a channel,
    or when it fails, the pages still find the change on their next look at the database."""
    if channel_url() is None:
        return
    try:
        _publisher.put(session_key(session_id), "{}", maxlen=_SESSION_KEEP)
    except Exception:
        logger.warning("could not signal a change of session %s", session_id, exc_info=True)


def session_last(session_id: Any) -> str:
    """The id of the session's latest change signal ("0-0" when none): wait after it for the next."""
    latest = _client().xrevrange(session_key(session_id), count=1)
    return _entry_id(latest[0][0]) if latest else "0-0"


async def asession_last(session_id: Any) -> str:
    """``session_last`` for asyncio."""
    latest = await _async_client().xrevrange(session_key(session_id), count=1)
    return _entry_id(latest[0][0]) if latest else "0-0"


async def session_wait(session_id: Any, *, after: str, timeout: float) -> str | None:
    """Wait up to ``timeout`` seconds, holding no thread, for a change signal after ``after``: its id, or None."""
    entries: Any = await _async_client().xread(
        {session_key(session_id): after}, block=max(1, int(timeout * 1000)), count=_SESSION_KEEP
    )
    for _key, items in entries or []:
        if items:
            return _entry_id(items[-1][0])
    return None


def publish(run: str | int, event: Mapping[str, Any]) -> None:
    """Append ``event`` to the run's stream, soon and in order: the process's publisher thread sends what its
    turns publish in batches (one round trip for many events; hundreds of turn threads sharing one client pool
    spent their time in its lock)."""
    _publisher.put(stream_key(run), json.dumps(event, default=str, ensure_ascii=False))


def flush(timeout: float = 5.0) -> bool:
    """Wait until every event published so far is sent (or ``timeout``); False if some are not."""
    return _publisher.flush(timeout)


class _Publisher:
    """One thread per process that sends published events: everything waiting goes in one pipeline."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, str, str, int | None] | threading.Event] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._signal_warned: dict[str, float] = {}

    def put(self, key: str, payload: str, *, maxlen: int | None = None) -> None:
        """Queue an event for the channel's server as the caller's settings name it now (not when it is sent)."""
        url = channel_url()
        if url is None:
            raise RuntimeError("The run channel needs a Redis-protocol server: set REDIS_URL (or RUN_EVENTS_URL).")
        self._ensure_thread()
        self._queue.put((url, key, payload, maxlen))

    def flush(self, timeout: float) -> bool:
        self._ensure_thread()
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="run-events", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < _BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            events = [item for item in items if not isinstance(item, threading.Event)]
            if events:
                self._send(events)
            for item in items:
                if isinstance(item, threading.Event):
                    item.set()

    def _send(self, events: list[tuple[str, str, str, int | None]]) -> None:
        by_server: dict[str, list[tuple[str, str, int | None]]] = {}
        for url, key, payload, maxlen in events:
            by_server.setdefault(url, []).append((key, payload, maxlen))
        for url, batch in by_server.items():
            runs = [item for item in batch if item[2] is None]
            signals = [item for item in batch if item[2] is not None]
            if runs:
                self._send_to(url, runs)
            if signals:
                self._signal(url, signals)

    def _signal(self, url: str, signals: list[tuple[str, str, int | None]]) -> None:
        """Session change signals: one try, and a warning at most once a minute when it fails. A page that misses
        one finds the change when it asks again; a server that is down (the embedded one not started by a
        process that runs turns in-line) must not fill the log or delay the runs' events."""
        try:
            pipe = _client(url).pipeline(transaction=False)
            for key, payload, maxlen in signals:
                pipe.xadd(key, {"e": payload}, maxlen=maxlen, approximate=True)
                pipe.expire(key, _keep_seconds())
            pipe.execute()
        except Exception as exc:  # noqa: BLE001 - best effort, said below
            now = time.monotonic()
            if now - self._signal_warned.get(url, -3600.0) >= 60:
                self._signal_warned[url] = now
                logger.warning("could not signal %s session change(s) on %s: %s", len(signals), url, exc)

    def _send_to(self, url: str, events: list[tuple[str, str, int | None]]) -> None:
        for attempt in range(1, _SEND_ATTEMPTS + 1):
            try:
                pipe = _client(url).pipeline(transaction=False)
                for key, payload, maxlen in events:
                    pipe.xadd(key, {"e": payload}, maxlen=maxlen, approximate=maxlen is not None)
                for key in {key for key, _payload, _maxlen in events}:
                    pipe.expire(key, _keep_seconds())
                pipe.execute()
                return
            except Exception:
                if attempt == _SEND_ATTEMPTS:
                    # Followers of these runs end from the database (``RunStream``); the turns are not affected.
                    logger.exception("could not publish %s run event(s); dropped", len(events))
                    return
                time.sleep(0.2 * attempt)


_BATCH = 1000
_SEND_ATTEMPTS = 5
_publisher = _Publisher()


def exists(run: str | int) -> bool:
    """Whether the channel still keeps ``run``'s events; False when it cannot be reached (logged): its readers
    then take a finished run's end from the database, as once its events have expired."""
    try:
        return bool(_client().exists(stream_key(run)))
    except redis.RedisError:
        logger.warning("could not ask the run channel whether run %s is kept; read as not kept", run)
        return False


def forget(*, runs: Iterable[str | int], sessions: Iterable[Any]) -> int:
    """Delete the event streams of ``runs`` and the change signals of ``sessions`` (an erasure: their events carry
    the person's words), then ask the server to rewrite its append-only file, so that the deleted words leave its
    disk too. The number of keys deleted; 0 without a channel. Best effort: an unreachable channel is logged (the
    streams expire after RUN_EVENTS_KEEP_SECONDS anyway)."""
    if channel_url() is None:
        return 0
    keys = [stream_key(run) for run in runs] + [session_key(session) for session in sessions]
    try:
        client = _client()
        deleted = sum(int(client.delete(*keys[i : i + 500])) for i in range(0, len(keys), 500))
        if deleted and client.config_get("appendonly").get("appendonly") == "yes":
            client.bgrewriteaof()
        return deleted
    except redis.RedisError:
        logger.warning("could not delete %s event streams of an erasure; they expire on their own", len(keys))
        return 0


def _decoded(entries: Any) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for _key, items in entries or []:
        for raw_id, fields in items:
            event_id = _entry_id(raw_id)
            payload = fields.get(b"e") or fields.get("e") or b"{}"
            out.append((event_id, json.loads(payload)))
    return out


def read(run: str | int, *, after: str = "0", block_seconds: float = 15.0) -> list[tuple[str, dict[str, Any]]]:
    """The run's events after ``after`` (an id, "0" for all), waiting up to ``block_seconds`` for one; [] when
    none came."""
    entries = _client().xread({stream_key(run): after}, block=max(1, int(block_seconds * 1000)), count=500)
    return _decoded(entries)


async def aread(run: str | int, *, after: str = "0", block_seconds: float = 15.0) -> list[tuple[str, dict[str, Any]]]:
    """``read`` for asyncio: waits without a thread."""
    entries = await _async_client().xread({stream_key(run): after}, block=max(1, int(block_seconds * 1000)), count=500)
    return _decoded(entries)


def _keepalive_seconds() -> float:
    return float(getattr(settings, "RUN_EVENTS_KEEPALIVE_SECONDS", 10.0))


def follow(run: str | int, *, after: str = "0", idle: Any = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """The run's events from ``after`` until a final one. ``idle()`` is asked after each quiet wait
    (``RUN_EVENTS_KEEPALIVE_SECONDS``); an event it returns (the run found finished some other way) is the last one,
    and when it returns none a ``KEEPALIVE`` event (id "") is yielded. A read that fails (the server restarting) is
    tried again for up to ``_RETRY_FOR`` seconds before the error is raised."""
    failing_since: float | None = None
    while True:
        try:
            batch = read(run, after=after, block_seconds=_keepalive_seconds())
            failing_since = None
        except (redis.ConnectionError, redis.TimeoutError):
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > _RETRY_FOR:
                raise
            time.sleep(0.5)
            continue
        final = idle() if idle is not None and not batch else None
        events, ended = _delivered(batch, final)
        yield from events
        if ended:
            return
        after = events[-1][0] if batch else after


async def afollow(run: str | int, *, after: str = "0", idle: Any = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``follow`` for asyncio; ``idle`` is an async callable."""
    failing_since: float | None = None
    while True:
        try:
            batch = await aread(run, after=after, block_seconds=_keepalive_seconds())
            failing_since = None
        except (redis.ConnectionError, redis.TimeoutError):
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > _RETRY_FOR:
                raise
            await asyncio.sleep(0.5)
            continue
        final = await idle() if idle is not None and not batch else None
        events, ended = _delivered(batch, final)
        for event in events:
            yield event
        if ended:
            return
        after = events[-1][0] if batch else after


def _delivered(
    batch: list[tuple[str, dict[str, Any]]], final: dict[str, Any] | None
) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """What a follower yields for one read, and whether it ends there: the batch up to its first final event; for
    an empty batch, ``final`` (what ``idle`` found: the run ended some other way) or a ``KEEPALIVE`` (id "")."""
    if not batch:
        return ([("", final)], True) if final is not None else ([("", {"type": KEEPALIVE})], False)
    for index, (_event_id, event) in enumerate(batch):
        if event.get("type") in FINAL_TYPES:
            return batch[: index + 1], True
    return batch, False


def backlog(queue: str) -> int | None:
    """How many messages wait in the broker's ``queue`` (a Redis-protocol broker's list); None when the broker is
    not one the channel can read."""
    broker = str(getattr(settings, "CELERY_BROKER_URL", "") or "")
    if broker.startswith("redis+socket://"):
        url: str | None = "unix://" + broker.removeprefix("redis+socket://")
    elif broker.startswith(("redis://", "rediss://")):
        url = broker
    else:
        return None
    if url == channel_url():
        return int(_client().llen(queue))
    client = redis.Redis.from_url(str(url), socket_connect_timeout=2, socket_timeout=2)
    try:
        return int(client.llen(queue))
    finally:
        client.close()
