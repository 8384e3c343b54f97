"""Workflows as finite-state machines declared in code: the definition.

A ``Workflow`` names its states, the transitions allowed between them, the slots it collects (a
pydantic model whose fields are all optional) and, per state, what the agent must do now (the resume
instruction). The model never changes state by writing prose: each turn it returns an instance of
``decision_schema`` (``next_state``, ``slots``, ``confidence``, ``reasoning``), and ``Workflow.step``
decides, without touching the database, whether that decision may be applied.

Here: the definition (``StateSpec``, ``Workflow``), checked when it is built, and what the machine answers
(where next, what is missing, what an action state runs). Beside it: ``decision`` (the model's decision and
its schema), ``transitions`` (the checks of ``step``), ``slots`` (merging slot values) and ``prompts`` (what
the workflow tells the model).

``sessions.services.transition_apply`` persists what ``step`` decided.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from pydantic import BaseModel

from agents.workflows import prompts
from agents.workflows.decision import WorkflowDecision, decided_reply_schema, decision_schema_for
from agents.workflows.slots import slots_merge
from agents.workflows.transitions import StepResult, recovery_problems, step_result
from core.errors import Refusal
from core.text import state_words

__all__ = [
    "MAX_RETRIES",
    "ActionContext",
    "ActionFailed",
    "PythonAction",
    "StateSpec",
    "StepResult",
    "UnknownWorkflowError",
    "Workflow",
    "WorkflowDecision",
    "recovery_problems",
    "workflow_of",
]

# The retry counter may reach this many failed turns; one more and the session moves to the failed state.
MAX_RETRIES = 3


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
        # The decision with the reply after it, for a turn that decides inside its reply's call.
        self.reply_schema = decided_reply_schema(self.decision_schema)
        _WORKFLOW_OF_SCHEMA[self.reply_schema] = weakref.ref(self)

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
        return slots_merge(self.slots_model, data, update, workflow_name=self.name, today=today)

    def step(
        self, *, state: str, data: Mapping[str, Any], decision: WorkflowDecision, today: date | None = None
    ) -> StepResult:
        """Decide whether ``decision`` may be applied in ``state`` with ``data``; pure, no database.

        An invalid transition (not in the table, or a state whose required slots are missing) changes
        nothing: neither the state nor the data. Invalid slot values are dropped and reported while the
        valid ones are kept.
        """
        return step_result(self, state=state, data=data, decision=decision, today=today)

    # --- prompts ---------------------------------------------------------------------------------
    def label(self, slot: str) -> str:
        return self.slot_labels.get(slot, slot)

    def state_label(self, state: str) -> str:
        """The state as people read it: its declared ``label``, else its name in words."""
        spec = self.specs.get(state)
        return (spec.label if spec is not None else "") or state_words(state)

    def next_question(self, state: str, data: Mapping[str, Any]) -> str:
        """The question the agent asks in ``state`` ("" when the state asks none)."""
        return prompts.next_question(self, state, data)

    def asked_slots(self, state: str, data: Mapping[str, Any]) -> tuple[str, ...]:
        """The slots the question of ``state`` asks about (for tests and the demo model)."""
        return prompts.asked_slots(self, state, data)

    def refusal_text(self, error: str) -> str:
        """A slot error of ``merge_slots`` ("depart_date: Value error, 2020-01-01 is in the past") as a person
        would say it ("depart date: 2020-01-01 is in the past")."""
        return prompts.refusal_text(self.slot_labels, error)

    def resume_instruction(self, state: str, data: Mapping[str, Any], *, refused: Sequence[str] = ()) -> str:
        """What to do now, what is already known (not to be asked again), the next question, and the data.

        This goes into every prompt (the "workflow" section), so the agent knows where it is even when
        the turns that collected the data have left the context window. ``refused``: the slot errors of this
        turn's decision (``TransitionOutcome.slot_errors``), which the reply must explain: the values were
        dropped, and without a word the user only sees the same question again.
        """
        return prompts.resume_instruction(self, state, data, refused=refused)

    def decision_messages(
        self,
        *,
        state: str,
        data: Mapping[str, Any],
        user_message: str,
        recent_turns: list[tuple[str, str]],
    ) -> list[dict[str, Any]]:
        """The prompt of the structured call that returns a ``decision_schema`` instance for this turn."""
        return prompts.decision_messages(
            self, state=state, data=data, user_message=user_message, recent_turns=recent_turns
        )

    def decided_reply_guide(self, *, state: str, data: Mapping[str, Any]) -> str:
        """What the prompt of a turn that decides inside its reply's call adds to the workflow section: how to
        decide, then how to reply in the state chosen (``prompts.decided_reply_guide``)."""
        return prompts.decided_reply_guide(self, state=state, data=data)

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
        decision = self.decision_schema.model_validate(
            {"next_state": next_state, "slots": dict(slots or {}), "confidence": 1.0, "reasoning": reasoning}
        )
        decision._by_action = True  # it may set the slots only actions set (transitions._decidable)
        return decision


# Each workflow by the decision schema it asks for (``workflow_of``); weak both ways, so that the versions of a
# workflow declared as data go when they are no longer used.
_WORKFLOW_OF_SCHEMA: weakref.WeakKeyDictionary[type[BaseModel], weakref.ref[Workflow]] = weakref.WeakKeyDictionary()


def workflow_of(schema: type[BaseModel] | None) -> Workflow | None:
    """The workflow whose decision schema is ``schema`` (the last one built with it), else None."""
    ref = _WORKFLOW_OF_SCHEMA.get(schema) if schema is not None else None
    return ref() if ref is not None else None
