"""The API's rates, counted atomically, and the rate of posting messages shared by every door that answers one.

DRF's own throttles read a client's request history from the cache, append to it and write it back: requests
that arrive together each read the same history, and all of them pass (100 messages at once on a 30/min limit let
32 to 45 through). Here a request is counted by one atomic ``incr`` of a counter per fixed window (``add`` makes
the counter, ``incr`` counts: single commands on Redis and the embedded Valkey; under a lock on the tests'
local-memory cache; best effort on the database cache, the fallback without a Redis-protocol server), and the
rate is judged over a sliding window: this window's count plus the previous window's, weighted by how much of
it the sliding window still covers. A refused request is not counted.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.core.cache import cache
from rest_framework.throttling import ScopedRateThrottle, SimpleRateThrottle, UserRateThrottle

_SCOPES = ("user", "messages", "anon")


class AtomicRateMixin(SimpleRateThrottle):
    """``allow_request`` on an atomic counter per window (see the module's docstring)."""

    _wait_seconds: float = 0.0
    # Set by DRF's ``SimpleRateThrottle`` from the rate ("30/min": 30 requests, 60 seconds).
    num_requests: int
    duration: int

    def allow_request(self, request: Any, view: Any) -> bool:
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        now = self.timer()
        window, elapsed = divmod(now, self.duration)
        counter = f"{self.key}:{int(window)}"
        count = _counted(self.cache, counter, timeout=2 * self.duration + 1)
        previous = int(self.cache.get(f"{self.key}:{int(window) - 1}") or 0)
        weight = 1 - elapsed / self.duration
        if previous * weight + count <= self.num_requests:
            return True
        self.cache.decr(counter)  # a refused request does not count
        if count > self.num_requests:  # this window alone is full: the next one
            self._wait_seconds = self.duration - elapsed
        else:  # the previous window's weight: until enough of it has slid out
            over = previous * weight + count - self.num_requests
            self._wait_seconds = min(self.duration - elapsed, over / previous * self.duration)
        return False

    def wait(self) -> float | None:
        return max(1.0, self._wait_seconds)


def _counted(store: Any, key: str, *, timeout: float) -> int:
    for _ in range(3):
        store.add(key, 0, timeout=int(timeout))
        try:
            return int(store.incr(key))
        except ValueError:  # expired between add and incr: make it again
            continue
    return int(store.incr(key))


class UserRateThrottleAtomic(UserRateThrottle, AtomicRateMixin):
    """``API_THROTTLE_USER`` per user (DRF's ``UserRateThrottle``, counted atomically)."""


class ScopedRateThrottleAtomic(ScopedRateThrottle, AtomicRateMixin):
    """A view's ``throttle_scope`` rate per user (DRF's ``ScopedRateThrottle``, counted atomically)."""


def messages_rate_wait(request: Any) -> int | None:
    """``API_THROTTLE_MESSAGES`` on the same per-user counter, whichever door: a message costs a model call.
    ``request`` is a request, or anything with ``user`` and ``META``. Seconds to wait, or None when allowed."""
    throttle = ScopedRateThrottleAtomic()
    if throttle.allow_request(request, SimpleNamespace(throttle_scope="messages")):
        return None
    return max(1, int(throttle.wait() or 1))


def rate_counters_forget(user_pk: Any) -> None:
    """Delete a person's rate counters (an erasure), for every scope, this window and the one before."""
    keys = []
    for scope in _SCOPES:
        rates: Any = settings.REST_FRAMEWORK.get("DEFAULT_THROTTLE_RATES") or {}
        rate = rates.get(scope)
        if not rate:
            continue
        duration = {"s": 1, "m": 60, "h": 3600, "d": 86400}[rate.split("/")[1][0]]
        window = int(time.time() // duration)
        keys += [f"throttle_{scope}_{user_pk}:{w}" for w in (window, window - 1)]
    cache.delete_many(keys)
