"""A small per-process cache of what retrieval measures per user and keeps for a while (the size of the
history, how redundant the store is): thread-safe, each answer kept ``ttl_seconds``, bounded (the oldest tenth
goes when it is full)."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class UserCache(Generic[V]):
    def __init__(self, *, ttl_seconds: float, max_entries: int = 10_000) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self._entries: dict[Hashable, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        """The value kept for ``key``, or None when there is none or it is older than ``ttl_seconds``."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or time.monotonic() - entry[0] >= self.ttl_seconds:
            return None
        return entry[1]

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            if len(self._entries) >= self.max_entries:
                for stale in sorted(self._entries, key=lambda k: self._entries[k][0])[: max(1, self.max_entries // 10)]:
                    del self._entries[stale]
            self._entries[key] = (time.monotonic(), value)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
