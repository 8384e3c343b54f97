"""Workflows as finite-state machines declared in code.

A ``Workflow`` names its states, the transitions allowed between them, the slots it collects (a
pydantic model whose fields are all optional) and, per state, what the agent must do now (the resume
instruction). The model never changes state by writing prose: each turn it returns an instance of
``decision_schema`` (``next_state``, ``slots``, ``confidence``, ``reasoning``), and ``Workflow.step``
decides, without touching the database, whether that decision may be applied.

``sessions.services.transition_apply`` persists what ``step`` decided.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from types import UnionType
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from core.errors import Refusal
from core.text import camel_case, state_words

# The retry counter may reach this many failed turns; one more and the session moves to the failed state.
MAX_RETRIES = 3


# The line of the workflow prompt that lists what the user's last message said and the workflow refused.
REFUSED_PREFIX = "NOT ACCEPTED from the user's last message:"


class WorkflowDecision(BaseModel):
    """What the model returns each turn. Workflows subclass it with a ``Literal`` of their states."""

    model_config = ConfigDict(extra="ignore")

    next_state: str = Field(description="The workflow state to be in after this user message.")
    slots: BaseModel = Field(description="Slot values stated by the user in this message; null when not given.")
    confidence: float = Field(default=1.0, ge=0.0, le=1.0, description="How sure you are, 0 to 1.")
    reasoning: str = Field(default="", max_length=1000, description="One short sentence: why this state.")
    wants_person: bool = Field(
        default=False, description="True only when the user asks to talk to a person (a human, not the assistant)."
    )

    @field_validator("slots", mode="before")
    @classmethod
    def _null_slots_mean_none_given(cls, value: Any) -> Any:
        # Models often send "slots": null when nothing was said; that is "no update", not an error.
        return {} if value is None else value


@dataclass(frozen=True)
class ActionContext:
    """What a Python action reads: who it runs for and the slots collected so far."""

    user: Any
    agent: Any
    session_id: Any
    data: Mapping[str, Any]


# A Python action: returns the structured output whose slots the workflow keeps (``on_action_result``), and
# moves to the state's success outcome; raising ``ActionFailed`` moves to its failure outcome.
PythonAction = Callable[[ActionContext], Mapping[str, Any] | None]


class ActionFailed(Exception):
    """Raised by a Python action: the workflow moves to the action's failure state; the message says why (the
    reply is told it)."""


class UnknownWorkflowError(KeyError, Refusal):
    """An agent refers to a workflow name that no module registered (saved around the admin's checks,
    ``Agent.clean``, or a workflow module since removed): its chats refuse new messages."""

    code = "agent_unavailable"
    status = 503
    public_message = "This agent's workflow is not available on this server; an operator has to fix the agent."


@dataclass(frozen=True)
class StateSpec:
    """One state: what to do in it, which slots it asks for, and which slots must be known to enter it."""

    name: str
    instruction: str
    # Slots this state asks for; the state is "done" when all of them are known.
    collects: tuple[str, ...] = ()
    # Slots this state also accepts but does not insist on (a return date while asking for dates).
    accepts: tuple[str, ...] = ()
    # Slots that must be known before the state may be entered (checked against the merged data).
    requires: tuple[str, ...] = ()
    question: str = ""
    # The question when the slot is already known and the user went back to change it.
    change_question: str = ""
    # Non-gathering states that still ask the next missing slot's question (the initial state).
    asks_next_missing: bool = False
    # What people read for this state in the chat ("Where from"); blank: the name in words ("Gathering origin").
    label: str = ""


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


class Workflow:
    """A finite-state machine an agent follows. Instances are registered by name in ``agents.workflows``."""

    def __init__(
        self,
        *,
        name: str,
        title: str,
        initial_state: str,
        specs: list[StateSpec],
        transitions: Mapping[str, frozenset[str]],
        terminal_states: frozenset[str],
        failed_state: str | None,
        slots_model: type[BaseModel],
        decision_schema: type[WorkflowDecision] | None = None,
        complete_state: str | None = None,
        action_states: Mapping[str, str | PythonAction] | None = None,
        action_outcomes: Mapping[str, tuple[str, str]] | None = None,
        handoff_states: frozenset[str] = frozenset(),
        slot_labels: Mapping[str, str] | None = None,
        describe: Callable[[Mapping[str, Any]], dict[str, str]] | None = None,
        on_action_result: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
        check_recovery: bool = True,
    ) -> None:
        self.name = name
        self.title = title
        # The version of a workflow declared as data (``agents.workflow_store``); None for one in code.
        self.version: int | None = None
        self.initial_state = initial_state
        self.specs: dict[str, StateSpec] = {spec.name: spec for spec in specs}
        self.states: tuple[str, ...] = tuple(spec.name for spec in specs)
        # An action state may always move to where its outcomes go: they are declared once, in action_outcomes.
        merged = {state: frozenset(targets) for state, targets in transitions.items()}
        for state, outcomes in (action_outcomes or {}).items():
            merged[state] = merged.get(state, frozenset()) | frozenset(outcomes)
        self.transitions: Mapping[str, frozenset[str]] = merged
        self.terminal_states = terminal_states
        self.failed_state = failed_state
        self.slots_model = slots_model
        # The model's structured output each turn; generated from the states and slots unless given.
        self.decision_schema = decision_schema or decision_schema_for(name, self.states, slots_model)
        # Where the flow goes once every gathering state is done (the confirmation step).
        self.complete_state = complete_state
        # What an action state runs: a tool's name (offered to the model in that state), or a Python function
        # the turn runs itself on entering the state (``PythonAction``).
        self.action_states: Mapping[str, str | PythonAction] = action_states or {}
        # Entering one of these hands the session to a person (the agent stops answering it).
        self.handoff_states = frozenset(handoff_states)
        self.action_outcomes: Mapping[str, tuple[str, str]] = action_outcomes or {}
        self.slot_labels: Mapping[str, str] = slot_labels or {}
        # Extra fields the instructions may use, computed from the data (a one-line trip summary).
        self.describe = describe
        # The slots a successful action's structured output (``ToolOutput.data``) sets; by default its keys
        # that are slots of this workflow.
        self.on_action_result = on_action_result
        self._check_definition()
        if check_recovery:
            # Off only to load a version saved before this check (its sessions keep running on it).
            self._check_recovery()
        _WORKFLOW_OF_SCHEMA[self.decision_schema] = weakref.ref(self)

    def __repr__(self) -> str:
        return f"<Workflow {self.name}>"

    def _check_definition(self) -> None:
        # A typo in a transition table would otherwise surface as a mysteriously rejected turn.
        known = set(self.states)
        problems = [s for s in (self.initial_state, self.failed_state, self.complete_state) if s and s not in known]
        problems += [s for s in (*self.action_states, *self.action_outcomes, *self.handoff_states) if s not in known]
        problems += [f"outcomes of {s}" for s in self.action_states if s not in self.action_outcomes]
        for source, targets in self.transitions.items():
            problems += [s for s in {source, *targets} if s not in known]
        for spec in self.specs.values():
            problems += [
                f"slot {s}" for s in (*spec.collects, *spec.accepts, *spec.requires) if s not in self.slot_names
            ]
        if problems:
            raise ValueError(f"workflow {self.name}: unknown names {sorted(set(problems))}")

    def _check_recovery(self) -> None:
        # Each action's failures go where they can be fixed, or to an end (``recovery_problems``).
        wrong = [
            problem
            for state, (_success, failure) in self.action_outcomes.items()
            for problem in recovery_problems(
                state=state,
                failure=failure,
                requires=self.specs[state].requires,
                failure_requires=self.specs[failure].requires,
                failure_targets=self.transitions.get(failure, frozenset()),
                ends=self.terminal_states | self.handoff_states | {self.failed_state or ""},
            )
        ]
        if wrong:
            raise ValueError(f"workflow {self.name}: {'; '.join(wrong)}")

    # --- the machine --------------------------------------------------------------------------
    @property
    def slot_names(self) -> tuple[str, ...]:
        return tuple(self.slots_model.model_fields)

    @property
    def gathering_states(self) -> tuple[str, ...]:
        return tuple(s for s in self.states if self.specs[s].collects)

    @property
    def is_free_chat(self) -> bool:
        """True for workflows with nothing to decide (one state, no slots): no structured call per turn."""
        return len(self.states) == 1 and not self.slot_names

    def decides_in(self, state: str) -> bool:
        """True when a turn in ``state`` may move the machine (it has outgoing transitions or slots to fill).

        Terminal states can still have ways out (FAILED → resume or start over, COMPLETED → a new trip).
        """
        return bool(self.transitions.get(state)) or bool(self.specs[state].collects if state in self.specs else ())

    def can_transition(self, a: str, b: str) -> bool:
        """True when the table allows ``a -> b``. Staying in a known state is always allowed."""
        if a not in self.specs or b not in self.specs:
            return False
        return a == b or b in self.transitions.get(a, frozenset())

    def missing_for(self, state: str, data: Mapping[str, Any]) -> list[str]:
        """Slots that must be known before ``state`` may be entered but are not in ``data``."""
        return [slot for slot in self.specs[state].requires if data.get(slot) in (None, "")]

    def first_missing_state(self, data: Mapping[str, Any]) -> str:
        """The first gathering state whose slots are not all known, else the completion state."""
        for state in self.gathering_states:
            if any(data.get(slot) in (None, "") for slot in self.specs[state].collects):
                return state
        return self.complete_state or self.initial_state

    def recovery_state(self, state: str) -> str | None:
        """Where a failed attempt of ``state``'s action is fixed with the user: its failure outcome, when that is
        a state the flow goes on from (not a terminal, failed or handoff state). None otherwise.

        The data collected so far is kept there, and the state leads back to the action (``_check_definition``
        makes sure of both), so a failure costs one question, not the conversation."""
        outcomes = self.action_outcomes.get(state)
        if outcomes is None:
            return None
        failure = outcomes[1]
        ends = self.terminal_states | self.handoff_states | {self.failed_state}
        return None if failure in ends else failure

    def clears_data_on_entry(self, from_state: str, to_state: str) -> bool:
        # Entering the initial state from elsewhere is "start over": the old data stays in the checkpoint log.
        return to_state == self.initial_state and from_state != self.initial_state

    # --- slots -----------------------------------------------------------------------------------
    def merge_slots(
        self, data: Mapping[str, Any], update: BaseModel | Mapping[str, Any] | None, *, today: date | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """Merge ``update`` into ``data``: every valid value is kept, every invalid one reported and dropped.

        Never removes a key of ``data``. Values are stored in JSON form (dates as ISO strings). Each new
        value is validated on its own by ``slots_model`` (types, ranges, "not in the past"), then against
        the data it joins (cross-field rules such as return date after departure).
        """
        if update is None:
            raw: dict[str, Any] = {}
        elif isinstance(update, BaseModel):
            raw = update.model_dump(exclude_none=True)
        else:
            raw = {k: v for k, v in update.items() if v is not None}
        merged = {k: v for k, v in data.items()}
        errors: list[str] = []
        fresh: dict[str, Any] = {}
        context = {"today": today, "check_past": True}
        for name, value in raw.items():
            if name not in self.slots_model.model_fields:
                errors.append(f"{name}: not a slot of {self.name}")
                continue
            try:
                single = self.slots_model.model_validate({name: value}, context=context)
            except ValidationError as exc:
                errors.append(_first_error(name, exc))
                continue
            fresh[name] = single.model_dump(mode="json")[name]
        together = {**merged, **fresh}
        if self._consistent(together, today=today):
            return together, errors
        # Some new value clashes with the data (or with another new value): admit them one by one.
        for name, value in fresh.items():
            candidate = {**merged, name: value}
            try:
                self.slots_model.model_validate(self._known(candidate), context={"today": today, "check_past": False})
            except ValidationError as exc:
                errors.append(_first_error(name, exc))
                continue
            merged = candidate
        return merged, errors

    def _consistent(self, data: Mapping[str, Any], *, today: date | None) -> bool:
        try:
            self.slots_model.model_validate(self._known(data), context={"today": today, "check_past": False})
        except ValidationError:
            return False
        return True

    def _known(self, data: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in data.items() if k in self.slots_model.model_fields}

    def step(
        self, *, state: str, data: Mapping[str, Any], decision: WorkflowDecision, today: date | None = None
    ) -> StepResult:
        """Decide whether ``decision`` may be applied in ``state`` with ``data``; pure, no database.

        An invalid transition (not in the table, or a state whose required slots are missing) changes
        nothing: neither the state nor the data. Invalid slot values are dropped and reported while the
        valid ones are kept.
        """
        target = decision.next_state
        merged, slot_errors = self.merge_slots(data, decision.slots, today=today)
        errors: list[str] = []
        if target not in self.specs:
            errors.append(f"unknown state {target!r}")
        elif not self.can_transition(state, target):
            errors.append(f"transition {state} -> {target} is not allowed")
        else:
            missing = [] if self.clears_data_on_entry(state, target) else self.missing_for(target, merged)
            if missing:
                errors.append(f"{target} needs {', '.join(missing)} first")
        if errors:
            return StepResult(False, state, state, dict(data), errors=errors + slot_errors, slot_errors=slot_errors)
        if (
            state in self.terminal_states
            and state != self.failed_state
            and target != self.initial_state
            and not self.clears_data_on_entry(state, target)
        ):
            # A finished run (a booked trip) is never changed by later text: only leaving it (a new run) can.
            changed = sorted(k for k in merged if merged.get(k) != data.get(k))
            slot_errors = slot_errors + [
                f"{name}: the {self.title.lower()} is finished, so it is not changed; start a new one to change it"
                for name in changed
            ]
            merged = dict(data)
        if self.clears_data_on_entry(state, target):
            merged = {}
        return StepResult(True, state, target, merged, errors=list(slot_errors), slot_errors=slot_errors)

    # --- prompts ---------------------------------------------------------------------------------
    def label(self, slot: str) -> str:
        return self.slot_labels.get(slot, slot)

    def state_label(self, state: str) -> str:
        """The state as people read it: its declared ``label``, else its name in words."""
        spec = self.specs.get(state)
        return (spec.label if spec is not None else "") or state_words(state)

    def next_question(self, state: str, data: Mapping[str, Any]) -> str:
        """The question the agent asks in ``state`` ("" when the state asks none)."""
        spec = self.specs[state]
        if spec.collects:
            known = all(data.get(s) not in (None, "") for s in spec.collects)
            return spec.change_question if known and spec.change_question else spec.question
        if spec.asks_next_missing:
            target = self.first_missing_state(data)
            return self.specs[target].question if self.specs[target].collects else ""
        return spec.question

    def asked_slots(self, state: str, data: Mapping[str, Any]) -> tuple[str, ...]:
        """The slots the question of ``state`` asks about (for tests and the demo model)."""
        spec = self.specs[state]
        if spec.collects:
            return spec.collects
        if spec.asks_next_missing:
            target = self.first_missing_state(data)
            return self.specs[target].collects
        return ()

    def _instruction(self, state: str, data: Mapping[str, Any]) -> str:
        fields = _Defaulting({k: v for k, v in data.items() if v not in (None, "")})
        if self.describe is not None:
            fields.update(self.describe(data))
        return self.specs[state].instruction.format_map(fields)

    def refusal_text(self, error: str) -> str:
        """A slot error of ``merge_slots`` ("depart_date: Value error, 2020-01-01 is in the past") as a person
        would say it ("depart date: 2020-01-01 is in the past")."""
        name, _, message = error.partition(": ")
        message = message.removeprefix("Value error, ")
        return f"{self.slot_labels.get(name) or name.replace('_', ' ')}: {message}" if message else error

    def resume_instruction(self, state: str, data: Mapping[str, Any], *, refused: Sequence[str] = ()) -> str:
        """What to do now, what is already known (not to be asked again), the next question, and the data.

        This goes into every prompt (the "workflow" section), so the agent knows where it is even when
        the turns that collected the data have left the context window. ``refused``: the slot errors of this
        turn's decision (``TransitionOutcome.slot_errors``), which the reply must explain: the values were
        dropped, and without a word the user only sees the same question again.
        """
        spec = self.specs[state]
        known = {k: v for k, v in data.items() if v not in (None, "")}
        changing = [s for s in spec.collects if s in known]
        lines = [
            f"WORKFLOW: {self.name} ({self.title})",
            f"CURRENT_STATE: {state}",
            self._instruction(state, known),
        ]
        settled = {k: v for k, v in known.items() if k not in changing}
        if settled:
            listed = ", ".join(f"{self.label(k)}={v}" for k, v in settled.items())
            lines.append(f"Already collected: {listed} — do not ask for these again.")
        if changing:
            current = ", ".join(f"{self.label(k)}={known[k]}" for k in changing)
            lines.append(f"The user went back to change {current}; ask only for the new value.")
        if spec.collects or spec.asks_next_missing:
            still = [
                self.label(s)
                for g in self.gathering_states
                for s in self.specs[g].collects
                if s not in known and s not in changing
            ]
            if still:
                lines.append(f"Still needed: {', '.join(still)}.")
        question = self.next_question(state, data)
        if question:
            lines.append(f"Next question: {question}")
        if refused:
            reasons = "; ".join(self.refusal_text(e) for e in refused)
            ask = " Then ask for it again." if question else ""
            lines.append(f"{REFUSED_PREFIX} {reasons}. Tell the user briefly that it was not used, and why.{ask}")
        lines.append(f"COLLECTED: {json.dumps(known, sort_keys=True, default=str)}")
        return "\n".join(lines)

    def decision_messages(
        self,
        *,
        state: str,
        data: Mapping[str, Any],
        user_message: str,
        recent_turns: list[tuple[str, str]],
    ) -> list[dict[str, Any]]:
        """The prompt of the structured call that returns a ``decision_schema`` instance for this turn."""
        allowed = sorted(self.transitions.get(state, frozenset()) | {state})
        slots_help = ", ".join(
            f"{name} ({f.description or f.annotation})" for name, f in self.slots_model.model_fields.items()
        )
        system = "\n".join(
            [
                f"You track the state of the '{self.title}' workflow. Do not answer the user; only decide.",
                f"WORKFLOW: {self.name}",
                f"CURRENT_STATE: {state}",
                f"ALLOWED_NEXT_STATES: {', '.join(allowed)}",
                f"COLLECTED: {json.dumps(dict(data), sort_keys=True, default=str)}",
                f"Slots: {slots_help}.",
                "Put in `slots` only values the user stated in the latest message (dates as YYYY-MM-DD); "
                "leave the rest null. Choose `next_state` from ALLOWED_NEXT_STATES: the first step whose "
                "information is still missing, or the confirmation step when everything is known.",
                f"Current step: {self._instruction(state, data)}",
                *self._recovery_lines(state),
            ]
        )
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for user_text, assistant_text in recent_turns:
            messages.append({"role": "user", "content": user_text})
            if assistant_text:
                messages.append({"role": "assistant", "content": assistant_text})
        messages.append({"role": "user", "content": user_message})
        return messages

    def _recovery_lines(self, state: str) -> list[str]:
        # In an action state, a turn starts only after an attempt that did not succeed (a success leaves the
        # state): repeating it unchanged is how a booking without seats looped to the failed state.
        recovery = self.recovery_state(state)
        if recovery is None:
            return []
        return [
            f"If the conversation shows that the last attempt of this step failed, choose {recovery} to fix it "
            "with the user (what was collected is kept); stay in this step only with a change that fixes the "
            "failure, or to retry after a temporary failure (a timeout, a service down); choose "
            f"{self.initial_state} only when the user asks to start over."
        ]

    def action_tool(self, state: str) -> str | None:
        """The tool an action state offers the model (None: no action, or a Python one)."""
        action = self.action_states.get(state)
        return action if isinstance(action, str) else None

    def python_action(self, state: str) -> PythonAction | None:
        """The Python function an action state runs on entering it (None: no action, or a tool)."""
        action = self.action_states.get(state)
        return action if action is not None and not isinstance(action, str) else None

    def action_slots(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """The slots a successful action sets, from its structured output (``on_action_result``, or the
        output's keys that are slots of this workflow)."""
        if self.on_action_result is not None:
            slots = dict(self.on_action_result(data))
        else:
            slots = {k: v for k, v in data.items() if k in self.slot_names}
        # As JSON would carry them (a date as its ISO text): the slots' own checks take it from there.
        return {k: json.loads(json.dumps(v, default=str)) for k, v in slots.items() if v is not None}

    def decision(self, *, next_state: str, slots: Mapping[str, Any] | None = None, reasoning: str = "") -> Any:
        """A decision built by code (the runtime applying a tool outcome), validated like a model's."""
        return self.decision_schema.model_validate(
            {"next_state": next_state, "slots": dict(slots or {}), "confidence": 1.0, "reasoning": reasoning}
        )


# Each workflow by the decision schema it asks for (``workflow_of``); weak both ways, so that the versions of a
# workflow declared as data go when they are no longer used.
_WORKFLOW_OF_SCHEMA: weakref.WeakKeyDictionary[type[BaseModel], weakref.ref[Workflow]] = weakref.WeakKeyDictionary()


def workflow_of(schema: type[BaseModel] | None) -> Workflow | None:
    """The workflow whose decision schema is ``schema`` (the last one built with it), else None."""
    ref = _WORKFLOW_OF_SCHEMA.get(schema) if schema is not None else None
    return ref() if ref is not None else None


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


def decision_schema_for(name: str, states: Sequence[str], slots_model: type[BaseModel]) -> type[WorkflowDecision]:
    """The decision a model returns each turn of workflow ``name``: ``next_state`` one of ``states``, and
    ``slots`` an update in which every slot is optional and loosely typed (a number stays a number, a date or
    a constrained string is a string): the slots' own types and checks run when the update is merged
    (``Workflow.merge_slots``), so that one bad value is reported and dropped instead of voiding the rest."""
    camel = camel_case(name, default="Workflow")
    update_fields: dict[str, Any] = {
        slot: (_loose(field.annotation), Field(default=None, description=field.description))
        for slot, field in slots_model.model_fields.items()
    }
    state_type: Any = Literal[tuple(states)]
    update = create_model(f"{camel}SlotsUpdate", __config__=ConfigDict(extra="ignore"), **update_fields)
    return create_model(
        f"{camel}Decision",
        __base__=WorkflowDecision,
        next_state=(state_type, Field(description="The workflow state to be in after this user message.")),
        slots=(
            update,
            Field(default_factory=update, description="Slot values stated in this message; null when not given."),
        ),
    )


def _loose(annotation: Any) -> Any:
    """The JSON type a model writes for a slot of type ``annotation``, optional (see ``decision_schema_for``)."""
    base = annotation
    while True:
        origin = get_origin(base)
        if origin is Annotated:
            base = get_args(base)[0]
        elif origin in (Union, UnionType):
            options = [arg for arg in get_args(base) if arg is not type(None)]
            base = options[0] if len(options) == 1 else str
        else:
            break
    if get_origin(base) is list or base is list:
        return Optional[list[Any]]  # noqa: UP045 - a type built at run time, not an annotation
    # Any JSON scalar: a number where a string was meant (or the reverse) is the slot's check to refuse,
    # value by value, not a reason to void the whole decision.
    return Optional[Union[str, int, float, bool]]  # noqa: UP007, UP045 - built at run time


class _Defaulting(dict[str, Any]):
    """``str.format_map`` helper: unknown slots render as "?" instead of raising."""

    def __missing__(self, key: str) -> str:
        return "?"


_MONTHS = ("January February March April May June July August September October November December").split()
_ISO_DAY = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")


def _first_error(name: str, exc: ValidationError) -> str:
    """The first validation error of a slot, in words a person reads ("at most 9", "there is no 31 February"),
    not pydantic's ("Input should be less than or equal to 9")."""
    first: Mapping[str, Any] = exc.errors()[0] if exc.errors() else {"msg": str(exc)}
    kind, ctx, value = first.get("type", ""), first.get("ctx") or {}, first.get("input")
    bounds = {
        "less_than_equal": "at most",
        "greater_than_equal": "at least",
        "less_than": "below",
        "greater_than": "above",
    }
    if kind in bounds:
        limit = next(iter(ctx.values()), "")
        return f"{name}: {bounds[kind]} {limit}"
    if kind in ("date_from_datetime_parsing", "date_parsing", "date_type") and isinstance(value, str):
        day = _ISO_DAY.match(value)
        if day and 1 <= int(day.group(2)) <= 12:
            return f"{name}: there is no {int(day.group(3))} {_MONTHS[int(day.group(2)) - 1]}"
        return f"{name}: {value!r} is not a date"
    if kind in ("int_parsing", "int_from_float"):
        return f"{name}: a whole number, please"
    return f"{name}: {first.get('msg', 'invalid value')}"
