"""The message rate holds when requests arrive together (core/throttles.py)."""

from __future__ import annotations

import threading
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from rest_framework.throttling import SimpleRateThrottle

from core.throttles import messages_rate_wait, rate_counters_forget


def _request(user: Any) -> Any:
    return SimpleNamespace(user=user, META={"REMOTE_ADDR": "192.0.2.7"})


@pytest.fixture(params=["local memory", "redis"])
def counters(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' local-memory cache, and a Redis one as every deployment has (the round trips let requests that
    arrive together interleave, as they do between the processes of a server)."""
    if request.param == "redis":
        from django.core.cache.backends.redis import RedisCache

        from tests.reliability.conftest import redis_queue_url

        store = RedisCache(redis_queue_url(), {"KEY_PREFIX": f"throttle-test-{uuid.uuid4().hex[:8]}"})
        monkeypatch.setattr(SimpleRateThrottle, "cache", store)


@pytest.mark.django_db
def test_a_hundred_messages_at_once_let_exactly_the_rate_through(
    alice: Any, monkeypatch: pytest.MonkeyPatch, counters: None
) -> None:
    """DRF's history throttle let 32 to 45 of 100 simultaneous messages through a 30/min limit."""
    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "messages", "30/min")
    start, allowed, waits = threading.Barrier(100), [], []
    lock = threading.Lock()

    def send() -> None:
        start.wait()
        wait = messages_rate_wait(_request(alice))
        with lock:
            (allowed.append(1) if wait is None else waits.append(wait))

    threads = [threading.Thread(target=send) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(allowed) == 30
    assert len(waits) == 70 and all(1 <= wait <= 60 for wait in waits)
    # Refused requests are not counted: the next one is refused for the same 30, not for 100.
    assert messages_rate_wait(_request(alice)) is not None


@pytest.mark.django_db
def test_the_previous_minute_still_counts_in_part(alice: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sliding window: 30 at the end of one minute and 30 more at the start of the next are not 60 allowed."""
    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "messages", "30/min")
    clock = [60 * 1000 + 50.0]  # ten seconds before a minute ends
    monkeypatch.setattr(SimpleRateThrottle, "timer", lambda self: clock[0])
    assert sum(messages_rate_wait(_request(alice)) is None for _ in range(40)) == 30
    clock[0] += 15  # five seconds into the next minute: 30 × 55/60 of the last one still weigh
    allowed_now = sum(messages_rate_wait(_request(alice)) is None for _ in range(30))
    assert allowed_now == 2
    clock[0] += 60  # a minute later: the last one's 2 weigh 2 × 55/60, the one before nothing
    assert sum(messages_rate_wait(_request(alice)) is None for _ in range(40)) == 28


@pytest.mark.django_db
def test_an_erasure_forgets_the_counters(alice: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "messages", "2/min")
    monkeypatch.setattr("django.conf.settings.REST_FRAMEWORK", {"DEFAULT_THROTTLE_RATES": {"messages": "2/min"}})
    assert messages_rate_wait(_request(alice)) is None and messages_rate_wait(_request(alice)) is None
    assert messages_rate_wait(_request(alice)) is not None
    rate_counters_forget(alice.pk)
    assert messages_rate_wait(_request(alice)) is None
