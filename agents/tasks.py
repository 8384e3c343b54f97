from __future__ import annotations

from celery import shared_task

from agents.runtime import stuck_turns_recover


@shared_task(name="agents.tasks.recover_stuck_turns", ignore_result=True, soft_time_limit=300, time_limit=360)
def recover_stuck_turns() -> int:
    """Resume turns whose process died between their checkpoint and their reply."""
    return stuck_turns_recover()
