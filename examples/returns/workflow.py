"""The returns workflow, declared once: its states, slots, questions, transitions and actions (a Python
eligibility rule, then the refund tool), and the state in which a person takes over.

The model's decision each turn (``next_state`` and the slots it read) is generated from this declaration;
``Workflow`` checks every transition and slot value before anything is saved.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from agents.workflows import StateSpec, Workflow
from examples.returns.tools import check_eligibility


class ReturnSlots(BaseModel):
    """What the workflow collects; every field optional until it is known."""

    model_config = ConfigDict(extra="forbid")

    order_id: Annotated[str, Field(pattern=r"^[A-Za-z]\d{4}$")] | None = Field(
        default=None, description="the order number, a letter and 4 digits (A1001)"
    )
    reason: Annotated[str, Field(min_length=3, max_length=300)] | None = Field(
        default=None, description="why the user returns it, in their words"
    )
    refund_reference: str | None = Field(default=None, description="set by the refund_request tool")
    refund_refused: str | None = Field(default=None, description="set by the refund_request tool")


def _outcome(data: Any) -> dict[str, str]:
    if data.get("refund_reference"):
        return {"outcome": f"The refund {data['refund_reference']} was issued; tell the user."}
    if data.get("refund_refused"):
        return {"outcome": f"No automatic refund: {data['refund_refused']}. Say so and offer a person's review."}
    return {"outcome": "The refund is being handled."}


RETURNS = Workflow(
    name="returns",
    title="Returns and refunds",
    initial_state="ASKING_ORDER",
    specs=[
        StateSpec(
            name="ASKING_ORDER",
            instruction="Help the user return something. Find out which order it is.",
            collects=("order_id",),
            question="Which order is it? The number is on your receipt (a letter and 4 digits).",
        ),
        StateSpec(
            name="ASKING_REASON",
            instruction="The order is {order_id}. Find out why the user returns it.",
            collects=("reason",),
            requires=("order_id",),
            question="What is the reason for the return?",
        ),
        StateSpec(
            name="CONFIRMING",
            instruction="Confirm: a refund for order {order_id}, because: {reason}. Ask the user to confirm.",
            requires=("order_id", "reason"),
            question="Shall I request the refund?",
        ),
        StateSpec(
            name="CHECKING",
            instruction="Checking whether order {order_id} can be refunded.",
            requires=("order_id", "reason"),
        ),
        StateSpec(
            name="NEEDS_PERSON",
            instruction="A person on the team reviews this return; tell the user they will hear from us.",
        ),
        StateSpec(
            name="REFUNDING",
            instruction="Request the refund now with the refund_request tool (order {order_id}).",
            requires=("order_id", "reason"),
        ),
        StateSpec(name="DONE", instruction="{outcome}"),
    ],
    transitions={
        "ASKING_ORDER": frozenset({"ASKING_REASON"}),
        "ASKING_REASON": frozenset({"ASKING_ORDER", "CONFIRMING"}),
        "CONFIRMING": frozenset({"ASKING_ORDER", "ASKING_REASON", "CHECKING"}),
        "CHECKING": frozenset(),
        "NEEDS_PERSON": frozenset({"ASKING_ORDER"}),
        "REFUNDING": frozenset(),
        "DONE": frozenset({"ASKING_ORDER"}),
    },
    terminal_states=frozenset({"DONE"}),
    failed_state=None,
    slots_model=ReturnSlots,
    complete_state="CONFIRMING",
    # CHECKING runs the refund rule in Python on entering it; REFUNDING offers the model the refund tool.
    action_states={"CHECKING": check_eligibility, "REFUNDING": "refund_request"},
    action_outcomes={"CHECKING": ("REFUNDING", "NEEDS_PERSON"), "REFUNDING": ("DONE", "DONE")},
    handoff_states=frozenset({"NEEDS_PERSON"}),
    describe=_outcome,
)
