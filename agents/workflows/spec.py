"""Workflows as data: the same declaration as ``Workflow(...)``, written as JSON (an operator edits it in
the admin, ``agents.models.WorkflowDefinition``), checked before it is saved.

A declaration::

    {
      "title": "Returns and refunds",
      "initial_state": "ASKING_ORDER",
      "slots": {"order_id": {"type": "string", "pattern": "^[A-Z]\\\\d{4}$", "description": "the order number"},
                "reason": {"type": "string", "min_length": 3}},
      "states": [
        {"name": "ASKING_ORDER", "instruction": "Find out which order it is.", "collects": ["order_id"],
         "question": "Which order is it?", "label": "Which order"},
        ...
      ],
      "transitions": {"ASKING_ORDER": ["ASKING_REASON"], ...},
      "terminal_states": ["DONE"],
      "failed_state": null,
      "complete_state": "CONFIRMING",
      "actions": {"REFUNDING": {"tool": "refund_request", "success": "DONE", "failure": "DONE"}}
    }

Slot types: ``string``, ``integer``, ``number``, ``boolean``, ``date``; limits: ``pattern``, ``min_length``,
``max_length``, ``minimum``, ``maximum``, ``choices``; a ``description`` the model reads.
``workflow_from_spec`` refuses, with one message per problem: unknown keys, unknown states or slots, a
state no transition reaches, an action whose tool is not registered, an action whose failures go where they
cannot be fixed (back to the action itself, or to a state that needs more than the action had or has no way
back to it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import date
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import SchemaError

from agents.workflows.base import StateSpec, Workflow, recovery_problems
from core.text import camel_case


class WorkflowSpecError(ValueError):
    """The declaration cannot be a workflow; ``problems`` lists every reason, each for people."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# At most 48 characters: the decision schema is named after it, and endpoints take names up to 64.
NAME_PATTERN = _NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")
# The limits each slot type takes (a limit that does not fit its type would fail every value at run time).
_LIMITS: dict[str, set[str]] = {
    "string": {"pattern", "min_length", "max_length", "choices"},
    "integer": {"minimum", "maximum"},
    "number": {"minimum", "maximum"},
    "boolean": set(),
    "date": set(),
}
_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "date": date}


class SlotSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["string", "integer", "number", "boolean", "date"] = "string"
    description: str = Field(default="", max_length=300)
    pattern: str | None = None
    min_length: int | None = Field(default=None, ge=0)
    max_length: int | None = Field(default=None, ge=1)
    minimum: float | None = None
    maximum: float | None = None
    choices: list[str] | None = None


class StateDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    instruction: str = Field(min_length=1, max_length=2000)
    collects: list[str] = []
    accepts: list[str] = []
    requires: list[str] = []
    question: str = Field(default="", max_length=500)
    change_question: str = Field(default="", max_length=500)
    asks_next_missing: bool = False
    label: str = Field(default="", max_length=60)


class ActionDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str
    success: str
    failure: str


class WorkflowDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=100)
    initial_state: str
    slots: dict[str, SlotSpec] = {}
    states: list[StateDecl] = Field(min_length=1)
    transitions: dict[str, list[str]] = {}
    terminal_states: list[str] = []
    handoff_states: list[str] = []
    failed_state: str | None = None
    complete_state: str | None = None
    actions: dict[str, ActionDecl] = {}


def workflow_from_spec(name: str, spec: Mapping[str, Any], *, tools: Iterable[str] | None = None) -> Workflow:
    """The ``Workflow`` that ``spec`` declares, named ``name``; ``WorkflowSpecError`` says everything wrong
    with it. ``tools``: the registered tool names an action may use (None: not checked)."""
    try:
        decl = WorkflowDecl.model_validate(spec)
    except ValidationError as exc:
        raise WorkflowSpecError([_pydantic_problem(error) for error in exc.errors()]) from None
    problems = _problems(name, decl, tools)
    if problems:
        raise WorkflowSpecError(problems)
    try:
        return Workflow(
            name=name,
            title=decl.title,
            initial_state=decl.initial_state,
            specs=[
                StateSpec(
                    name=s.name,
                    instruction=s.instruction,
                    collects=tuple(s.collects),
                    accepts=tuple(s.accepts),
                    requires=tuple(s.requires),
                    question=s.question,
                    change_question=s.change_question,
                    asks_next_missing=s.asks_next_missing,
                    label=s.label.strip(),
                )
                for s in decl.states
            ],
            transitions={s.name: frozenset(decl.transitions.get(s.name, [])) for s in decl.states},
            terminal_states=frozenset(decl.terminal_states),
            handoff_states=frozenset(decl.handoff_states),
            failed_state=decl.failed_state,
            slots_model=_slots_model(name, decl.slots),
            complete_state=decl.complete_state,
            action_states={state: action.tool for state, action in decl.actions.items()},
            action_outcomes={state: (action.success, action.failure) for state, action in decl.actions.items()},
            # Checked when a version is saved (``tools`` given); a version saved before the check still loads.
            check_recovery=tools is not None,
        )
    except (ValueError, TypeError, SchemaError) as exc:  # a limit pydantic cannot build, say
        raise WorkflowSpecError([str(exc).splitlines()[0]]) from None


def _problems(name: str, decl: WorkflowDecl, tools: Iterable[str] | None) -> list[str]:
    problems: list[str] = []
    if not _NAME.fullmatch(name):
        problems.append(f"name {name!r}: a letter, then letters, digits or '_' (at most 48)")
    states = [s.name for s in decl.states]
    known = set(states)
    for state in sorted({s for s in states if states.count(s) > 1}):
        problems.append(f"state {state} is declared more than once")
    for state in states:
        if not _NAME.fullmatch(state):
            problems.append(f"state {state!r}: a letter, then letters, digits or '_'")

    def check_state(where: str, state: str | None) -> None:
        if state is not None and state not in known:
            problems.append(f"{where} names unknown state {state!r} (states: {', '.join(states)})")

    check_state("initial_state", decl.initial_state)
    check_state("failed_state", decl.failed_state)
    check_state("complete_state", decl.complete_state)
    for state in decl.terminal_states:
        check_state("terminal_states", state)
    for state in decl.handoff_states:
        check_state("handoff_states", state)
    for source, targets in decl.transitions.items():
        check_state("transitions", source)
        for target in targets:
            check_state(f"transitions of {source}", target)
    for state, action in decl.actions.items():
        check_state("actions", state)
        check_state(f"the action of {state} (success)", action.success)
        check_state(f"the action of {state} (failure)", action.failure)
    slots = set(decl.slots)
    for slot, slot_spec in decl.slots.items():
        if not _NAME.fullmatch(slot):
            problems.append(f"slot {slot!r}: a letter, then letters, digits or '_'")
        given = {key for key in _LIMITS["string"] | _LIMITS["integer"] if getattr(slot_spec, key) is not None}
        for key in sorted(given - _LIMITS[slot_spec.type]):
            allowed = ", ".join(sorted(_LIMITS[slot_spec.type])) or "none"
            problems.append(f"slot {slot}: {key} does not apply to a {slot_spec.type} (its limits: {allowed})")
        if slot_spec.pattern is not None:
            try:
                re.compile(slot_spec.pattern)
            except re.error as exc:
                problems.append(f"slot {slot}: pattern {slot_spec.pattern!r} is not a regular expression ({exc})")
    for declared in decl.states:
        for field in ("collects", "accepts", "requires"):
            for slot in getattr(declared, field):
                if slot not in slots:
                    problems.append(
                        f"state {declared.name} {field} unknown slot {slot!r} "
                        f"(slots: {', '.join(sorted(slots)) or 'none'})"
                    )
    if tools is not None:
        registered = set(tools)
        for state, action in decl.actions.items():
            if action.tool not in registered:
                problems.append(
                    f"the action of {state} uses tool {action.tool!r}, which is not registered "
                    f"(tools: {', '.join(sorted(registered))})"
                )
    if not problems and tools is not None:
        problems += _recovery_problems(decl)
    if not problems:
        unreachable = known - _reachable(decl)
        if unreachable:
            problems.append(
                f"no transition reaches {', '.join(s for s in states if s in unreachable)} from {decl.initial_state}"
            )
    return problems


def _recovery_problems(decl: WorkflowDecl) -> list[str]:
    """Where each action's failures go must be a state that can fix them (``recovery_problems``)."""
    by_name = {s.name: s for s in decl.states}
    ends = {*decl.terminal_states, *decl.handoff_states, decl.failed_state or ""}
    problems: list[str] = []
    for state, action in decl.actions.items():
        # An action state may always move to its outcomes; the failure state's own ways out are declared.
        back = set(decl.transitions.get(action.failure, []))
        if action.failure in decl.actions:
            back |= {decl.actions[action.failure].success, decl.actions[action.failure].failure}
        problems += recovery_problems(
            state=state,
            failure=action.failure,
            requires=by_name[state].requires,
            failure_requires=by_name[action.failure].requires,
            failure_targets=back,
            ends=ends,
        )
    return problems


def _reachable(decl: WorkflowDecl) -> set[str]:
    """The states a conversation can get to from the initial one (transitions, actions, the failed state)."""
    edges: dict[str, set[str]] = {s.name: set(decl.transitions.get(s.name, [])) for s in decl.states}
    for state, action in decl.actions.items():
        edges[state] |= {action.success, action.failure}
    seen = {decl.initial_state}
    if decl.failed_state:
        seen.add(decl.failed_state)  # where repeated failures send any state
    frontier = list(seen)
    while frontier:
        for target in edges.get(frontier.pop(), set()):
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    return seen


def _slots_model(name: str, slots: Mapping[str, SlotSpec]) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for slot, spec in slots.items():
        base: Any = Literal[tuple(spec.choices)] if spec.choices else _TYPES[spec.type]
        limits: dict[str, Any] = {
            key: value
            for key, value in {
                "pattern": spec.pattern,
                "min_length": spec.min_length,
                "max_length": spec.max_length,
                "ge": spec.minimum,
                "le": spec.maximum,
            }.items()
            if value is not None
        }
        typed: Any = Annotated[base, Field(**limits)] if limits else base
        fields[slot] = (typed | None, Field(default=None, description=spec.description or None))
    camel = camel_case(name, default="Workflow")
    # Patterns in Python's syntax, as the declaration's check reads them (pydantic's default is Rust's).
    config = ConfigDict(extra="forbid", regex_engine="python-re")
    model: type[BaseModel] = create_model(f"{camel}Slots", __config__=config, **fields)
    return model


def _pydantic_problem(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid"))
