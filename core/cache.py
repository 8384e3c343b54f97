"""The cache on the embedded Valkey (the default without ``REDIS_URL``): Django's Redis cache that starts the
embedded server before its first connection, so a process that did not start the stack (``manage.py shell``,
``runserver``, a one-off script) finds it as ``make run``'s processes do."""

from __future__ import annotations

from typing import Any

from django.core.cache.backends.redis import RedisCache
from django.utils.functional import cached_property

from core import embedded_broker


class EmbeddedValkeyCache(RedisCache):
    @cached_property
    def _cache(self) -> Any:
        embedded_broker.ensure_configured()  # started under a file lock by the first process that asks
        return RedisCache._cache.func(self)  # type: ignore[attr-defined]
