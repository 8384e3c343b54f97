from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.postgres.indexes import BrinIndex
from django.db import models


def staff_signed(reply: dict[str, Any]) -> str:
    """How a staff reply reads inside ``Turn.assistant_message``: "[name (staff)] text"."""
    return f"[{reply.get('author', '')} (staff)] {reply.get('text', '')}"


class ChatSession(models.Model):
    """A conversation with one agent, and the durable state of its workflow.

    ``version`` increases on every state write; writers compare-and-set it (optimistic concurrency).
    """

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        NEEDS_HUMAN = "needs_human", "Needs a human"
        CLOSED = "closed", "Closed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: session_user_recent (user, updated_at) leads with it.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions", db_index=False
    )
    agent = models.ForeignKey("agents.Agent", on_delete=models.PROTECT, related_name="sessions")
    title = models.CharField(max_length=200, blank=True)
    workflow = models.CharField(max_length=80)
    # The version of a workflow declared in the admin that this session started on (None: a workflow of the
    # code's): an edit of the declaration never changes a running conversation.
    workflow_version = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=60)
    data = models.JSONField(default=dict, blank=True, help_text="Slots collected so far.")
    retry_count = models.PositiveIntegerField(default=0)
    last_transition = models.CharField(max_length=140, blank=True)
    last_good_state = models.CharField(max_length=60, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.ACTIVE)
    version = models.PositiveIntegerField(default=0)
    # Progressive summary of the turns that left the sliding window.
    summary = models.TextField(blank=True)
    summary_through_seq = models.PositiveIntegerField(default=0, help_text="Last turn seq folded into the summary.")
    summary_requested_seq = models.PositiveIntegerField(
        default=0, help_text="Highest seq a summary task was enqueued for."
    )
    # Branches (``sessions.services.branches``): a session forked from ``parent`` at its turn ``fork_seq`` starts
    # from the checkpoint taken before that turn (``forked_from``) with copies of the turns before it. Every
    # branch of one chat, its first session included once it has been forked, carries the chat's ``chat_root``
    # (the first session's id; NULL: a chat never forked), so that they list together.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="branches", db_index=False
    )
    fork_seq = models.PositiveIntegerField(
        null=True, blank=True, help_text="The parent's turn this branch replaces (the turns before it are copied)."
    )
    chat_root = models.UUIDField(null=True, blank=True)
    forked_from = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks", db_index=False
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [
            # The session list: WHERE user_id = ? ORDER BY updated_at DESC.
            models.Index(fields=["user", "-updated_at"], name="session_user_recent"),
            # Sessions needing a human (the dashboard, the admin's filter). A plain btree: no LIKE index.
            models.Index(fields=["status"], name="session_status"),
            # The branches of a chat, and a user's chats that have branches (memory's branch rule):
            # WHERE user_id = ? AND chat_root IS NOT NULL; WHERE chat_root = ?. Only forked chats are in it.
            models.Index(
                fields=["user", "chat_root"], condition=models.Q(chat_root__isnull=False), name="session_user_branches"
            ),
            # A delete of a session or a pruned checkpoint sets its branches' links to NULL: WHERE parent_id IN (...),
            # WHERE forked_from_id IN (...). Only branches are in them.
            models.Index(fields=["parent"], condition=models.Q(parent__isnull=False), name="session_parent"),
            models.Index(
                fields=["forked_from"], condition=models.Q(forked_from__isnull=False), name="session_forked_from"
            ),
        ]

    def __str__(self) -> str:
        return self.title or f"Session {str(self.id)[:8]}"

    @property
    def chat_id(self) -> uuid.UUID:
        """The chat this session is a branch of: the id its branches share (its own when never forked)."""
        return self.chat_root or self.id


class Turn(models.Model):
    """One user message and the agent's reply. The message is saved before any model call."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"

    # No index of its own: turn_seq_unique (session, seq) leads with it.
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="turns", db_index=False)
    seq = models.PositiveIntegerField()
    user_message = models.TextField()
    assistant_message = models.TextField(blank=True)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)  # turn_stuck_sweep
    # Note: NULL, not "", so that turns without a key never collide in the unique constraint below.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    error = models.TextField(blank=True)
    state_before = models.CharField(max_length=60, blank=True)
    state_after = models.CharField(max_length=60, blank=True)
    steps = models.PositiveIntegerField(default=0)
    step_limit_hit = models.BooleanField(default=False)
    # Replies of staff to a session handed to a person, in order: {"author", "text", "at"} (also appended to
    # assistant_message, as API clients have always read them). The chat shows them apart, signed.
    staff_replies = models.JSONField(default=list, blank=True)
    truncated = models.BooleanField(
        default=False, help_text="The reply was still cut off by the token limit after its continuations: kept as is."
    )
    is_demo = models.BooleanField(default=False, help_text="Answered by the offline demo model, not an LLM.")
    # The context inspector: sections and their tokens, included/dropped turns and memories, degradations.
    composition = models.JSONField(default=dict, blank=True)
    # What memory retrieval kept and dropped for this turn, and why.
    retrieval = models.JSONField(default=dict, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # Set in the transaction that writes the turn's memories: the proof the write ran (memory.services).
    memories_written_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="turn_seq_unique"),
            # A retried POST with the same Idempotency-Key returns the first turn instead of running again.
            models.UniqueConstraint(
                fields=["session", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="turn_idempotency_unique",
            ),
        ]
        indexes = [
            # Crash recovery sweep: WHERE status = 'running' AND started_at < now() - interval.
            models.Index(fields=["status", "started_at"], name="turn_stuck_sweep"),
            # Time windows (the dashboard, the alert rules every minute, the admin's date filter): rows are
            # written in time order, so a BRIN index (a few pages for millions of rows) finds a window's rows.
            BrinIndex(fields=["created_at"], name="turn_created_brin"),
            # The memory-write sweep (every 2 minutes): completed turns whose write has not committed. Only
            # those are in it, a handful; without it the sweep read every turn.
            models.Index(
                fields=["completed_at"],
                condition=models.Q(memories_written_at__isnull=True, status="completed"),
                name="turn_memory_write_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.user_message[:40]}"

    @property
    def agent_message(self) -> str:
        """The agent's own reply: ``assistant_message`` without the staff replies appended to it."""
        text = self.assistant_message
        for reply in self.staff_replies or []:
            signed = staff_signed(reply)
            text = text.replace("\n\n" + signed, "", 1) if ("\n\n" + signed) in text else text.replace(signed, "", 1)
        return text

    @property
    def message_cut(self) -> dict[str, Any] | None:
        """How the user's message was cut to fit its budget in the prompt, if it was (from the composition)."""
        cuts = self.composition.get("cut_inputs") if isinstance(self.composition, dict) else None
        for cut in cuts or []:
            if isinstance(cut, dict) and cut.get("input") == "message":
                return {key: cut.get(key) for key in ("original_tokens", "kept_tokens", "tokens_cut")}
        return None


# A turn still being answered (its runner may have died: the sweep finishes it), and one that is done.
TURN_UNFINISHED = (Turn.Status.RUNNING, Turn.Status.PENDING)
TURN_FINISHED = (Turn.Status.COMPLETED, Turn.Status.FAILED)


class Checkpoint(models.Model):
    """Append-only log of a session's workflow state: before every model call and at every transition."""

    class Reason(models.TextChoices):
        BEFORE_CALL = "before_call", "Before a model call"
        TRANSITION = "transition", "Transition"
        INVALID_TRANSITION = "invalid_transition", "Invalid transition (rejected)"
        RETRY = "retry", "Failed turn (retry counted)"
        FAILED = "failed", "Moved to FAILED"
        RESET = "reset", "Reset"
        RESUME = "resume", "Resumed from a checkpoint"
        RECOVERED = "recovered", "Recovered after a crash"
        HANDOFF = "handoff", "Handed to a human"
        FORK = "fork", "Forked from another branch"

    # No index of its own: checkpoint_seq_unique (session, seq) leads with it.
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    seq = models.PositiveIntegerField()
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="checkpoints")
    state = models.CharField(max_length=60)
    data = models.JSONField(default=dict, blank=True)
    retry_count = models.PositiveIntegerField(default=0)
    transition = models.CharField(max_length=140, blank=True)
    reason = models.CharField(max_length=24, choices=Reason.choices)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="checkpoint_seq_unique")]
        # Time windows (the dashboard, the alert rules): see Turn.
        indexes = [BrinIndex(fields=["created_at"], name="checkpoint_created_brin")]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.state} ({self.reason})"


class SessionLease(models.Model):
    """Who runs a session's turn now, until when: one turn at a time per session, with no connection held.

    A runner takes the lease (``sessions.locks``), a heartbeat extends it while the turn runs, and it is
    deleted when the turn ends. A runner that dies stops extending it: once ``expires_at`` passes (the
    database's clock), the next message or the sweep takes it over and resumes the turn from its checkpoint.
    No foreign key: a lease may outlive its session by its expiry, and deleting a session takes it first."""

    session_id = models.UUIDField(primary_key=True)
    owner = models.UUIDField()
    expires_at = models.DateTimeField()
    # Set while the lease waits, handed over by the door that accepted a message, for a turn worker to claim it
    # (``sessions.locks.SessionTurnLock.claim``); null once a runner holds it. The sweep finds a turn whose task
    # was lost (a worker that died with it reserved) by a hand-over that nobody claimed.
    handed_over_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "turn lease"

    def __str__(self) -> str:
        return f"lease of {self.session_id} until {self.expires_at:%H:%M:%S}"
