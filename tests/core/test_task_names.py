"""A task's name is its module path; the names of before still run, once, for one release (core.task_names)."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import wait_for
from core import task_names
from core.task_names import FORMERLY
from memory.models import Memory
from sessions.models import Turn
from sessions.services import session_create
from tests.world import make_agent


def _tasks() -> dict[str, Any]:
    from config.celery import app

    app.loader.import_default_modules()
    return dict(app.tasks)


def test_each_task_is_named_for_its_module_path_and_listed_with_its_former_name() -> None:
    ours = {name: task for name, task in _tasks().items() if not name.startswith("celery.")}
    named_by_path = {name for name, task in ours.items() if name == f"{task.__module__}.{task.__name__}"}
    assert named_by_path == set(FORMERLY), "every task of ours, named <module>.<function>, is in core.task_names"
    assert all(name.startswith("web.tasks.") for name in named_by_path)
    assert set(ours) == set(FORMERLY) | set(FORMERLY.values()), "nothing else: each name and its former one"
    for name, former in FORMERLY.items():
        new, old = ours[name], ours[former]
        assert (old.__module__, old.__name__) == (new.__module__, new.__name__), former
        for option in ("acks_late", "max_retries", "soft_time_limit", "time_limit", "autoretry_for", "retry_backoff"):
            assert getattr(old, option, None) == getattr(new, option, None), (former, option)


def test_a_former_name_is_routed_where_its_task_is(settings: Any) -> None:
    routes = settings.CELERY_TASK_ROUTES
    for name in task_names.OPERATIONS:
        assert routes[name] == routes[FORMERLY[name]] == {"queue": settings.CELERY_OPS_QUEUE}
    turn = task_names.RUN_TURN
    assert routes[turn] == routes[FORMERLY[turn]] == {"queue": settings.CELERY_TURNS_QUEUE}
    assert task_names.WRITE_TURN_MEMORIES not in routes  # the background queue, the default


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_task_queued_under_its_former_name_runs_once(celery_worker: Any, alice: Any) -> None:
    """A message an older deployment queued (memory.tasks.write_turn_memories) is run by this release's worker,
    once: one episodic memory for the turn, one run in the worker's log."""
    from config.celery import app

    session = session_create(user=alice, agent=make_agent("chat"))
    turn = Turn.objects.create(
        session=session, seq=1, user_message="My sister lives in Lyon.", assistant_message="Noted.", status="completed"
    )
    queued = app.send_task(FORMERLY[task_names.WRITE_TURN_MEMORIES], args=[turn.pk])

    def runs() -> list[str]:
        return [
            line
            for line in celery_worker.log_text().splitlines()
            if f"{FORMERLY[task_names.WRITE_TURN_MEMORIES]}[{queued.id}]" in line and "succeeded" in line
        ]

    [line] = wait_for(runs, timeout=60, message=f"the queued memory write\n{celery_worker.log_text()[-2000:]}")
    assert "'written': True" in line, line
    assert Memory.objects.filter(user=alice, source_turn=turn, kind="episodic").count() == 1
    assert f"[{queued.id}]" not in celery_worker.log_text().split(line, 1)[1], "it ran once"
