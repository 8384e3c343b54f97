from __future__ import annotations

from celery import shared_task

from agents.runtime import stuck_turns_enqueue, turn_recover


@shared_task(name="agents.tasks.recover_stuck_turns", ignore_result=True, soft_time_limit=60, time_limit=90)
def recover_stuck_turns() -> int:
    """Find the turns whose process died between their checkpoint and their reply; send each to
    ``recover_turn``."""
    return stuck_turns_enqueue()


# One turn: its model calls (each with its timeouts and retries), tools and steps, under the step limit.
@shared_task(name="agents.tasks.recover_turn", ignore_result=True, soft_time_limit=900, time_limit=960)
def recover_turn(turn_id: int) -> bool:
    """Finish one orphaned turn from its last checkpoint (a no-op when it is finished or running elsewhere)."""
    return turn_recover(turn_id=turn_id)
