from __future__ import annotations

from celery import shared_task

from agents.runtime import stuck_turns_recover

SOFT_TIME_LIMIT = 300


@shared_task(
    name="agents.tasks.recover_stuck_turns", ignore_result=True, soft_time_limit=SOFT_TIME_LIMIT, time_limit=360
)
def recover_stuck_turns() -> int:
    """Resume turns whose process died between their checkpoint and their reply. No new one starts after
    half the time limit, so the limit does not cut a turn short (the rest are the next sweep's)."""
    return stuck_turns_recover(budget_seconds=SOFT_TIME_LIMIT / 2)
