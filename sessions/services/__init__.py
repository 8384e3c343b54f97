"""Writes to a session's durable workflow state and its append-only checkpoint log, one module a responsibility.

- ``versioned``: every state write is a compare-and-set on ``ChatSession.version`` (optimistic concurrency); a
  writer holding an outdated copy gets ``StaleSessionError`` instead of silently overwriting someone else's
  change (an operator's reset while a turn was running, say);
- ``checkpoints``: the checkpoint log, its sequence numbers allocated under the session row lock (gap-free per
  session, never clashing), and its retention;
- ``transitions``: the state machine's writes (a decision applied or refused, a failed turn counted);
- ``turn_rows``: the hand-written statements the orchestrator writes a turn with;
- ``handoff``: a session handed to a person, the staff's replies, handed back;
- ``lifecycle``: a session created, deleted, reset, resumed from a checkpoint;
- ``branches``: a session forked at one of its turns (an edit, a regenerate), a new branch of its chat.
"""

from __future__ import annotations

from sessions.selectors import stuck_turns_find
from sessions.services.branches import ForkRefused, branch_switch, session_fork
from sessions.services.checkpoints import (
    checkpoint_before_call,
    checkpoint_insert_sql,
    checkpoint_number_taken,
    checkpoint_record,
    checkpoints_prune,
)
from sessions.services.handoff import session_hand_back, session_hand_off, turn_staff_reply_append
from sessions.services.lifecycle import (
    session_create,
    session_create_with_history,
    session_delete,
    session_reset,
    session_resume_from,
    session_resume_last_good,
)
from sessions.services.transitions import TransitionOutcome, transition_apply, turn_failure_record
from sessions.services.turn_rows import (
    CompleteWrite,
    turn_complete_write,
    turn_insert,
    turn_insert_with_checkpoint,
    turn_reopen_kept,
    turn_write_unfinished,
)
from sessions.services.versioned import StaleSessionError

__all__ = [
    "CompleteWrite",
    "ForkRefused",
    "StaleSessionError",
    "TransitionOutcome",
    "branch_switch",
    "checkpoint_before_call",
    "checkpoint_insert_sql",
    "checkpoint_number_taken",
    "checkpoint_record",
    "checkpoints_prune",
    "session_create",
    "session_create_with_history",
    "session_delete",
    "session_fork",
    "session_hand_back",
    "session_hand_off",
    "session_reset",
    "session_resume_from",
    "session_resume_last_good",
    "stuck_turns_find",
    "transition_apply",
    "turn_complete_write",
    "turn_failure_record",
    "turn_insert",
    "turn_reopen_kept",
    "turn_insert_with_checkpoint",
    "turn_staff_reply_append",
    "turn_write_unfinished",
]
