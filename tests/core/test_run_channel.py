"""The run channel (``core/events.py``): a stream of events per turn on a Redis-protocol server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.test import override_settings

from core import events
from tests.reliability.conftest import redis_queue_url


@pytest.fixture
def channel() -> Iterator[str]:
    url = redis_queue_url()
    with override_settings(RUN_EVENTS_URL=url):
        yield url


def test_two_deployments_sharing_a_redis_never_read_each_others_runs(channel: str) -> None:
    """Turn ids start at 1 in every database (and every test run): a run stream named only by its turn id was
    read by another deployment's, or a later test run's, follower of the same id."""
    run = 1
    first, second = f"first-{uuid.uuid4().hex[:8]}", f"second-{uuid.uuid4().hex[:8]}"
    with override_settings(RUN_EVENTS_PREFIX=first):
        events.publish(run, {"type": "done", "text": "the first deployment's reply"})
        assert events.flush()
        assert events.exists(run)
        assert [event["text"] for _id, event in events.read(run, block_seconds=1)] == ["the first deployment's reply"]
    with override_settings(RUN_EVENTS_PREFIX=second):
        assert not events.exists(run)
        assert events.read(run, block_seconds=0.2) == []


def test_the_prefix_is_the_queue_by_default(channel: str) -> None:
    with override_settings(RUN_EVENTS_PREFIX="", CELERY_TASK_DEFAULT_QUEUE="shop-agents"):
        assert events.stream_key(7) == "shop-agents:run:7:events"


def test_an_event_goes_to_the_server_its_publisher_named_even_if_it_is_sent_later(channel: str) -> None:
    """The publisher thread sends events after ``publish`` returns: it once read the server's address then, from
    settings that had changed meanwhile (a test's override ended), and sent them elsewhere."""
    prefix = f"late-{uuid.uuid4().hex[:8]}"
    with override_settings(RUN_EVENTS_PREFIX=prefix):
        for number in range(300):
            events.publish(1, {"type": "delta", "text": str(number)})
    with override_settings(RUN_EVENTS_URL="redis://127.0.0.1:1/0", RUN_EVENTS_PREFIX=prefix):
        assert events.flush()
    with override_settings(RUN_EVENTS_PREFIX=prefix):
        sent = events.read(1, block_seconds=1)
    assert [event["text"] for _id, event in sent] == [str(number) for number in range(300)]


def test_session_signals_to_a_server_that_is_down_cost_one_warning_not_errors(caplog: pytest.LogCaptureFixture) -> None:
    """Every turn signals its session's open pages. A process that runs turns in-line, with the embedded server
    not started, logged an ERROR with a traceback for each turn's signal, after five tries."""
    with override_settings(RUN_EVENTS_URL="redis://127.0.0.1:1/0"), caplog.at_level("WARNING", logger="core.events"):
        for number in range(5):
            events.session_changed(f"session-{number}")
            assert events.flush()
    records = [r for r in caplog.records if r.name == "core.events"]
    assert [r.levelname for r in records] == ["WARNING"], [r.getMessage() for r in records]
