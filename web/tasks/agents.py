from __future__ import annotations

from orchestrator.runtime import stuck_turns_enqueue, turn_execute, turn_recover
from web.tasks.registry import background_task


@background_task(soft_time_limit=60, time_limit=90)
def recover_stuck_turns() -> int:
    """Find the turns whose process died between their checkpoint and their reply; send each to
    ``recover_turn``."""
    return stuck_turns_enqueue()


# One turn: its model calls (each with its timeouts and retries), tools and steps, under the step limit.
@background_task(soft_time_limit=900, time_limit=960)
def recover_turn(turn_id: int) -> bool:
    """Finish one orphaned turn from its last checkpoint (a no-op when it is finished or running elsewhere)."""
    return turn_recover(turn_id=turn_id)


# A turn accepted by a web request, run on a turn worker (a thread pool: it waits on models, holding no database
# connection meanwhile). Acknowledged when it ends (acks_late): a worker stopped gracefully hands back what it had
# reserved, and the broker keeps what a dead one held. The lease is the one guard of exactly-once: the run claims
# it under an owner of its own, a worker that dies stops extending it, and the sweep resumes the turn within
# TURN_LEASE_SECONDS + TURN_SWEEP_SECONDS; a task that was lost before a worker claimed its lease is found by the
# sweep too (orchestrator.recovery.lost_turns_let_go). A late redelivery finds the turn finished, and does nothing.
@background_task(acks_late=True)
def run_turn(turn_id: int, owner: str, orphan_ids: list[int], resumed: bool, checkpoint_fresh: bool) -> str:
    """Run a submitted turn under the lease it was handed, its events on the run channel."""
    return turn_execute(
        turn_id=turn_id, owner=owner, orphan_ids=orphan_ids, resumed=resumed, checkpoint_fresh=checkpoint_fresh
    )
