"""Transitions: whether a decision may be applied (``step_result``, what ``Workflow.step`` returns as a
``StepResult``), and what is wrong with where a definition sends an action's failures (``recovery_problems``).

Pure: nothing here touches the database (``sessions.services.transition_apply`` persists a step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from agents.workflows.base import Workflow
    from agents.workflows.decision import WorkflowDecision


@dataclass(frozen=True)
class StepResult:
    """What ``Workflow.step`` decided: the state and data after the decision, and why anything was refused."""

    applied: bool
    from_state: str
    to_state: str
    data: dict[str, Any]
    errors: list[str] = field(default_factory=list)
    slot_errors: list[str] = field(default_factory=list)

    @property
    def changed_state(self) -> bool:
        return self.applied and self.to_state != self.from_state


def _decidable(workflow: Workflow, slots: Any) -> tuple[dict[str, Any], list[str]]:
    """The decision's slots a decision may set, and the names of those it may not: a slot that no state collects
    or accepts is set by the workflow's actions (a booking's reference, by the tool that booked it), so a model's
    decision that names one ("booking_reference": "FAKE123") is refused, not stored. A workflow that declares no
    collected slot at all leaves every slot to its decisions."""
    raw = slots.model_dump(exclude_none=True) if isinstance(slots, BaseModel) else dict(slots or {})
    declared = {name for spec in workflow.specs.values() for name in (*spec.collects, *spec.accepts)}
    if not declared:
        return raw, []
    return {k: v for k, v in raw.items() if k in declared}, sorted(k for k in raw if k not in declared)


def step_result(
    workflow: Workflow,
    *,
    state: str,
    data: Mapping[str, Any],
    decision: WorkflowDecision,
    today: date | None = None,
) -> StepResult:
    """Whether ``decision`` may be applied in ``state`` with ``data`` (``Workflow.step`` says how)."""
    target = decision.next_state
    said, set_by_actions = (
        (decision.slots, []) if getattr(decision, "_by_action", False) else _decidable(workflow, decision.slots)
    )
    merged, slot_errors = workflow.merge_slots(data, said, today=today)
    slot_errors = [
        f"{name}: set by the workflow's own actions, never by a decision" for name in set_by_actions
    ] + slot_errors
    errors: list[str] = []
    if target not in workflow.specs:
        errors.append(f"unknown state {target!r}")
    elif not workflow.can_transition(state, target):
        errors.append(f"transition {state} -> {target} is not allowed")
    else:
        missing = [] if workflow.clears_data_on_entry(state, target) else workflow.missing_for(target, merged)
        if missing:
            errors.append(f"{target} needs {', '.join(missing)} first")
    if errors:
        return StepResult(False, state, state, dict(data), errors=errors + slot_errors, slot_errors=slot_errors)
    if (
        state in workflow.terminal_states
        and state != workflow.failed_state
        and target != workflow.initial_state
        and not workflow.clears_data_on_entry(state, target)
    ):
        # A finished run (a booked trip) is never changed by later text: only leaving it (a new run) can.
        changed = sorted(k for k in merged if merged.get(k) != data.get(k))
        slot_errors = slot_errors + [
            f"{name}: the {workflow.title.lower()} is finished, so it is not changed; start a new one to change it"
            for name in changed
        ]
        merged = dict(data)
    if workflow.clears_data_on_entry(state, target):
        merged = {}
    return StepResult(True, state, target, merged, errors=list(slot_errors), slot_errors=slot_errors)


def recovery_problems(
    *,
    state: str,
    failure: str,
    requires: Sequence[str],
    failure_requires: Sequence[str],
    failure_targets: frozenset[str] | set[str],
    ends: frozenset[str] | set[str],
) -> list[str]:
    """What is wrong with sending the failures of ``state``'s action to ``failure``, for people (empty: nothing).

    A failure that stays in the action state repeats the same attempt unchanged; a state where the failure is
    fixed (anything but a terminal, failed or handoff state) must take the data the action had (its
    ``requires`` no more than the action's), and must lead back to the action."""
    if failure in ends:
        return []
    if failure == state:
        return [f"the failures of {state}'s action go back to {state}: the same attempt would be repeated unchanged"]
    problems = []
    extra = [slot for slot in failure_requires if slot not in requires]
    if extra:
        problems.append(
            f"the failures of {state}'s action go to {failure}, which requires {', '.join(extra)} that {state} "
            "does not: the data of a failed attempt could not enter it"
        )
    if state not in failure_targets:
        problems.append(
            f"the failures of {state}'s action go to {failure}, which has no transition back to {state}: "
            "what is fixed there could not be tried again"
        )
    return problems
