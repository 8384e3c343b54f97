"""What the steps of a turn share (``TurnContext``) and the events a turn yields."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from core.db import release_connection
from llm.base import CallContext, Purpose
from sessions.models import TURN_FINISHED, TURN_UNFINISHED, ChatSession, Turn
from sessions.services import checkpoint_before_call

if TYPE_CHECKING:
    from agents.models import Agent
    from agents.workflows import Workflow
    from sessions.context import TurnHistory

AGENT_SWITCHED_OFF = "This chat's agent has been switched off by an operator."
# A plug-in's workflow whose setting is gone (a restart without its AGENT_EXTRA_WORKFLOWS): restoring it restores
# the chat.
AGENT_WORKFLOW_GONE = "This chat's agent is not available on this server now (its workflow {name!r} is not installed)."
HANDOFF_NOTICE = "I've passed this conversation to a person on our team; they will reply here."
UNFINISHED = TURN_UNFINISHED
FINISHED = TURN_FINISHED


# Set while a turn worker runs a turn: each model call gives the thread's database connection back before it
# starts (to the pool, or closed), so a turn that waits on a model holds none (``orchestrator.runtime``).
release_connection_before_model_calls: ContextVar[bool] = ContextVar(
    "release_connection_before_model_calls", default=False
)


class TurnEvent(TypedDict, total=False):
    """One event of a turn, as the doors stream it (``type`` says which keys it has; docs/web-and-api.md)."""

    type: Literal["turn", "delta", "state", "tool", "recovered", "done", "error"]
    turn_id: int
    seq: int
    text: str
    state: str
    label: str
    data: dict[str, Any]
    status: str
    error: str
    rejected: list[str]
    name: str
    ok: bool
    error_kind: str
    reply: str
    turn_status: str
    is_demo: bool
    truncated: bool
    replayed: bool
    title: str
    message_cut: dict[str, Any] | None
    resumed: bool
    code: str
    message: str
    # The run channel's id of the event (a turn run by a turn worker): the SSE ``id:``, for Last-Event-ID.
    event_id: str


@dataclass
class TurnContext:
    """One turn being answered: what every step reads, and what the steps before it found.

    ``done`` ends the pipeline (the turn was refused, handed off or answered); ``checkpoint_fresh`` says the
    turn's opening checkpoint still stands, so the first model call needs no other."""

    session: ChatSession
    turn: Turn
    agent: Agent
    provider: Any
    workflow: Workflow
    counter: Any
    checkpoint_fresh: bool = False
    # The turn was saved by an earlier request that died mid-turn (or is an orphan being finished).
    resumed: bool = False
    history: TurnHistory | None = None
    retrieved: Any = None
    retrieval_report: dict[str, Any] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    tool_names: list[str] = field(default_factory=list)
    # The decision travels inside the reply's own call (one model call for a turn that needs no tool): the tools
    # and the hand-off are offered to it as functions (``orchestrator.steps.route``).
    decision_in_reply: bool = False
    # The workflow's decision was taken inside the reply's call this turn (``orchestrator.decided``), and what that
    # call's reply had said when it was cut off by the token limit (the reply step continues it).
    decided: bool = False
    reply_so_far: str = ""
    composition_extra: dict[str, Any] = field(default_factory=dict)
    done: bool = False

    @property
    def message(self) -> str:
        return self.turn.user_message

    def call(self, purpose: Purpose, **extra: Any) -> CallContext:
        """The ``CallContext`` of a model call of this turn, which follows at once: on a turn worker, the
        database connection goes back first (``release_connection_before_model_calls``)."""
        if release_connection_before_model_calls.get():
            release_connection()
        return CallContext(
            purpose=purpose, agent_id=self.agent.pk, session_id=self.session.pk, turn_id=self.turn.pk, **extra
        )

    def before_call(self) -> None:
        """Checkpoint the state before a model call (unless the turn's opening checkpoint still stands)."""
        if self.checkpoint_fresh:
            self.checkpoint_fresh = False
            return
        checkpoint_before_call(session=self.session, turn=self.turn)

    def reload(self) -> None:
        reload_session(self.session)

    def state_event(self) -> TurnEvent:
        return state_event(self.session, self.workflow)


def reload_session(session: ChatSession) -> None:
    """Read the session again, with its agent and user (one query; a plain refresh drops them)."""
    session.refresh_from_db(from_queryset=ChatSession.objects.select_related("agent", "user"))


def state_event(session: ChatSession, workflow: Workflow | None = None) -> TurnEvent:
    """The session's state; ``label`` is how people read it (the workflow's label, or the name in words)."""
    event: TurnEvent = {"type": "state", "state": session.state, "data": session.data, "status": session.status}
    if workflow is not None:
        event["label"] = workflow.state_label(session.state)
    return event


def error_event(code: str, message: str, turn: Turn) -> TurnEvent:
    return {"type": "error", "code": code, "message": message, "turn_id": turn.pk}


def done_event(turn: Turn, session: ChatSession, *, replayed: bool = False) -> TurnEvent:
    return {
        "type": "done",
        "turn_id": turn.pk,
        "seq": turn.seq,
        "reply": turn.assistant_message,
        "state": session.state,
        "data": session.data,
        "status": session.status,
        "turn_status": turn.status,
        "is_demo": turn.is_demo,
        "truncated": turn.truncated,
        "replayed": replayed,
        "title": session.title,
        # The message was longer than its budget in the prompt: the model saw it cut (the user is told).
        "message_cut": turn.message_cut,
    }
