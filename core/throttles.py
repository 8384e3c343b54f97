"""The rate of posting messages, shared by every door that answers one (API, web chat, MCP)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rest_framework.throttling import ScopedRateThrottle


def messages_rate_wait(request: Any) -> int | None:
    """``API_THROTTLE_MESSAGES`` on the same per-user counter, whichever door: a message costs a model call.
    ``request`` is a request, or anything with ``user`` and ``META``. Seconds to wait, or None when allowed."""
    throttle = ScopedRateThrottle()
    if throttle.allow_request(request, SimpleNamespace(throttle_scope="messages")):  # type: ignore[arg-type]
        return None
    return max(1, int(throttle.wait() or 1))
