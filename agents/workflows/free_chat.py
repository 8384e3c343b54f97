"""The plain "free chat" workflow: one state, nothing to collect, no structured call per turn."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agents.workflows.base import StateSpec, Workflow, WorkflowDecision


class NoSlots(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FreeChatDecision(WorkflowDecision):
    next_state: Literal["CHATTING"] = "CHATTING"
    slots: NoSlots = Field(default_factory=NoSlots)


FREE_CHAT = Workflow(
    name="free_chat",
    title="Free chat",
    initial_state="CHATTING",
    specs=[StateSpec(name="CHATTING", instruction="Talk with the user; there is no form to fill in.")],
    transitions={"CHATTING": frozenset()},
    terminal_states=frozenset(),
    # Nothing to fail back from: failed turns are counted, but the conversation simply goes on.
    failed_state=None,
    slots_model=NoSlots,
    decision_schema=FreeChatDecision,
)
