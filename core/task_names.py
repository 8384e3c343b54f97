"""The name of every Celery task, and the name it had before.

A task's name is its module path: ``web.tasks.agents.run_turn`` is the function ``run_turn`` in
``web/tasks/agents.py`` (Celery's own default, so a reader, or a tool, follows a name to its code). The layers
below the doors send tasks by these names (``core.queue.enqueue``) and never import a task module.

Until 2026-12-08 the tasks kept the names of the modules they had lived in (``agents.tasks.run_turn``). A
worker of this release still runs a message queued under a name of before (``web.tasks.registry``), and the
sweeps that look into a queue look for both names (``core.queue.queued_args``), so that nothing a running
deployment had queued is lost in an upgrade. The names of before go in the release after next.
"""

from __future__ import annotations

RUN_TURN = "web.tasks.agents.run_turn"
RECOVER_TURN = "web.tasks.agents.recover_turn"
RECOVER_STUCK_TURNS = "web.tasks.agents.recover_stuck_turns"
RECORD_WORKER_HEARTBEAT = "web.tasks.core.record_worker_heartbeat"
WRITE_TURN_MEMORIES = "web.tasks.memory.write_turn_memories"
REQUEUE_LOST_MEMORY_WRITES = "web.tasks.memory.requeue_lost_memory_writes"
SYNC_USER_INDEXES = "web.tasks.memory.sync_user_indexes"
EVALUATE_ALERTS = "web.tasks.observability.evaluate_alerts"
SUMMARIZE_SESSION = "web.tasks.sessions.summarize_session"
PRUNE_CHECKPOINTS = "web.tasks.sessions.prune_checkpoints"
REQUEUE_LOST_SUMMARIES = "web.tasks.sessions.requeue_lost_summaries"

# Each name, and the name it had before (accepted for one release).
FORMERLY: dict[str, str] = {
    RUN_TURN: "agents.tasks.run_turn",
    RECOVER_TURN: "agents.tasks.recover_turn",
    RECOVER_STUCK_TURNS: "agents.tasks.recover_stuck_turns",
    RECORD_WORKER_HEARTBEAT: "config.tasks.record_worker_heartbeat",
    WRITE_TURN_MEMORIES: "memory.tasks.write_turn_memories",
    REQUEUE_LOST_MEMORY_WRITES: "memory.tasks.requeue_lost_memory_writes",
    SYNC_USER_INDEXES: "memory.tasks.sync_user_indexes",
    EVALUATE_ALERTS: "observability.tasks.evaluate_alerts",
    SUMMARIZE_SESSION: "sessions.tasks.summarize_session",
    PRUNE_CHECKPOINTS: "sessions.tasks.prune_checkpoints",
    REQUEUE_LOST_SUMMARIES: "sessions.tasks.requeue_lost_summaries",
}

# Beat's tasks and turn recovery: on the operations queue, never behind a backlog (config/settings/background.py).
OPERATIONS = (
    RECOVER_STUCK_TURNS,
    RECOVER_TURN,
    RECORD_WORKER_HEARTBEAT,
    EVALUATE_ALERTS,
    REQUEUE_LOST_MEMORY_WRITES,
    REQUEUE_LOST_SUMMARIES,
    PRUNE_CHECKPOINTS,
    SYNC_USER_INDEXES,
)


def with_former(name: str) -> frozenset[str]:
    """``name`` and the name it had before (a message in a queue may carry either)."""
    former = FORMERLY.get(name)
    return frozenset((name, former)) if former else frozenset((name,))
