"""A backlog on the default broker drains whole: 2,000 tasks queued at once on the embedded Valkey, taken by
one worker as make run starts it (bench/broker.py). Its rate is a benchmark figure (bench/README.md, "The
default broker under a backlog"), printed here and not asserted: a timing goal has no place in a test."""

from __future__ import annotations

import pytest

from bench.broker import run

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_thousand_queued_tasks_all_run_once() -> None:
    result = run(argv=[], tasks=2000, max_seconds=240)

    print(f"\n2,000 tasks drained at {result['drained_per_second']}/s")
    assert result["left"] == 0
    assert result["succeeded"] == 2000
    assert result["ran_twice"] == 0
