"""Where an action's failures go is declared, and checked when the workflow is built or declared (issue 36):
to a state that can fix them (it takes the action's data and leads back to it), or to an end."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from agents.workflows import StateSpec, Workflow
from agents.workflows.spec import WorkflowSpecError, workflow_from_spec
from examples.booking.workflow import FLIGHT_BOOKING
from examples.returns.workflow import RETURNS


class Slots(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item: str | None = None
    size: str | None = None


def _workflow(*, failure: str, fix_requires: tuple[str, ...] = ("item",), back: bool = True) -> Workflow:
    return Workflow(
        name="orders",
        title="Orders",
        initial_state="ASKING",
        specs=[
            StateSpec(name="ASKING", instruction="Ask.", collects=("item",), question="Which item?"),
            StateSpec(name="FIXING", instruction="Fix it.", requires=fix_requires),
            StateSpec(name="ORDERING", instruction="Order it.", requires=("item",)),
            StateSpec(name="DONE", instruction="Done."),
        ],
        transitions={
            "ASKING": frozenset({"FIXING"}),
            "FIXING": frozenset({"ORDERING"} if back else {"ASKING"}),
            "ORDERING": frozenset(),
            "DONE": frozenset({"ASKING"}),
        },
        terminal_states=frozenset({"DONE"}),
        failed_state=None,
        slots_model=Slots,
        action_states={"ORDERING": "place_order"},
        action_outcomes={"ORDERING": ("DONE", failure)},
    )


def test_a_failure_that_can_be_fixed_leads_back_and_the_decision_prompt_says_so() -> None:
    workflow = _workflow(failure="FIXING")
    assert workflow.recovery_state("ORDERING") == "FIXING"
    assert workflow.can_transition("ORDERING", "FIXING") and workflow.can_transition("FIXING", "ORDERING")
    system = workflow.decision_messages(state="ORDERING", data={"item": "a"}, user_message="hm", recent_turns=[])
    assert "the last attempt of this step failed, choose FIXING" in system[0]["content"]
    assert _workflow(failure="DONE").recovery_state("ORDERING") is None  # an end: nothing to fix there


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"failure": "ORDERING"}, "go back to ORDERING: the same attempt would be repeated unchanged"),
        ({"failure": "FIXING", "fix_requires": ("item", "size")}, "requires size that ORDERING does not"),
        ({"failure": "FIXING", "back": False}, "has no transition back to ORDERING"),
        ({"failure": "NOWHERE"}, "unknown names ['NOWHERE']"),
    ],
)
def test_a_failure_state_that_cannot_fix_it_is_refused_when_the_workflow_is_built(
    kwargs: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ValueError) as caught:
        _workflow(**kwargs)
    assert expected in str(caught.value)


def _declaration(**action: str) -> dict[str, Any]:
    return {
        "title": "Orders",
        "initial_state": "ASKING",
        "slots": {"item": {"type": "string"}, "size": {"type": "string"}},
        "states": [
            {"name": "ASKING", "instruction": "Ask.", "collects": ["item"], "question": "Which item?"},
            {"name": "FIXING", "instruction": "Fix it.", "requires": ["item", "size"]},
            {"name": "ORDERING", "instruction": "Order it.", "requires": ["item"]},
            {"name": "DONE", "instruction": "Done."},
        ],
        "transitions": {"ASKING": ["ORDERING"], "FIXING": ["ASKING"], "DONE": ["ASKING"]},
        "terminal_states": ["DONE"],
        "actions": {"ORDERING": {"tool": "place_order", "success": "DONE", **action}},
    }


def test_a_declared_workflow_says_where_failures_go_and_each_problem_is_named() -> None:
    with pytest.raises(WorkflowSpecError) as caught:
        workflow_from_spec("orders", _declaration(failure="FIXING"), tools=["place_order"])
    assert caught.value.problems == [
        "the failures of ORDERING's action go to FIXING, which requires size that ORDERING does not: the data of "
        "a failed attempt could not enter it",
        "the failures of ORDERING's action go to FIXING, which has no transition back to ORDERING: what is fixed "
        "there could not be tried again",
    ]
    with pytest.raises(WorkflowSpecError) as itself:
        workflow_from_spec("orders", _declaration(failure="ORDERING"), tools=["place_order"])
    assert "the same attempt would be repeated unchanged" in itself.value.problems[0]

    # A version saved before this check still loads (tools not given: the load path), so its sessions run on.
    assert workflow_from_spec("orders", _declaration(failure="FIXING")).recovery_state("ORDERING") == "FIXING"

    fixed = copy.deepcopy(_declaration(failure="FIXING"))
    fixed["states"][1]["requires"] = ["item"]
    fixed["transitions"]["FIXING"] = ["ORDERING", "ASKING"]
    workflow = workflow_from_spec("orders", fixed, tools=["place_order"])
    assert workflow.recovery_state("ORDERING") == "FIXING"


def test_the_shipped_workflows_pass_the_check() -> None:
    assert FLIGHT_BOOKING.recovery_state("BOOKING") == "CONFIRMING"
    assert RETURNS.recovery_state("REFUNDING") is None and RETURNS.recovery_state("CHECKING") is None
