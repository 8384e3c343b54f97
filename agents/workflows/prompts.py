"""What a workflow tells the model: the workflow section of every prompt (``resume_instruction``: where the
conversation is, what is known, the next question, what was refused), the messages of the structured call that
decides each turn (``decision_messages``), and how a reader of the section (the demo model) finds its lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents.workflows.base import Workflow

# The line of the workflow prompt that lists what the user's last message said and the workflow refused.
REFUSED_PREFIX = "NOT ACCEPTED from the user's last message:"

# The lines of the workflow section as a reader finds them again: the next question, the refused values with why,
# and the collected data (JSON: ``collected_in``).
QUESTION_LINE = re.compile(r"^Next question:\s*(.+?)\s*$", re.MULTILINE)
REFUSED_LINE = re.compile(rf"^{re.escape(REFUSED_PREFIX)}\s*(.+?)\. Tell the user", re.MULTILINE)
_COLLECTED_LINE = re.compile(r"^COLLECTED:\s*(\{.*\})\s*$", re.MULTILINE)


def collected_in(text: str) -> dict[str, Any]:
    """The collected data a workflow section lists (its ``COLLECTED:`` line); {} when it has none, or not an object."""
    found = _COLLECTED_LINE.search(text)
    if found is None:
        return {}
    try:
        loaded = json.loads(found.group(1))
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def next_question(workflow: Workflow, state: str, data: Mapping[str, Any]) -> str:
    """The question the agent asks in ``state`` ("" when the state asks none)."""
    spec = workflow.specs[state]
    if spec.collects:
        known = all(data.get(s) not in (None, "") for s in spec.collects)
        return spec.change_question if known and spec.change_question else spec.question
    if spec.asks_next_missing:
        target = workflow.first_missing_state(data)
        return workflow.specs[target].question if workflow.specs[target].collects else ""
    return spec.question


def asked_slots(workflow: Workflow, state: str, data: Mapping[str, Any]) -> tuple[str, ...]:
    """The slots the question of ``state`` asks about (for tests and the demo model)."""
    spec = workflow.specs[state]
    if spec.collects:
        return spec.collects
    if spec.asks_next_missing:
        target = workflow.first_missing_state(data)
        return workflow.specs[target].collects
    return ()


def refusal_text(slot_labels: Mapping[str, str], error: str) -> str:
    """A slot error as a person would say it, the slot by its label (``Workflow.refusal_text``)."""
    name, _, message = error.partition(": ")
    message = message.removeprefix("Value error, ")
    return f"{slot_labels.get(name) or name.replace('_', ' ')}: {message}" if message else error


def resume_instruction(workflow: Workflow, state: str, data: Mapping[str, Any], *, refused: Sequence[str] = ()) -> str:
    """The workflow section of the prompt in ``state`` (``Workflow.resume_instruction`` says what it holds)."""
    spec = workflow.specs[state]
    known = {k: v for k, v in data.items() if v not in (None, "")}
    changing = [s for s in spec.collects if s in known]
    lines = [
        f"WORKFLOW: {workflow.name} ({workflow.title})",
        f"CURRENT_STATE: {state}",
        _instruction(workflow, state, known),
    ]
    settled = {k: v for k, v in known.items() if k not in changing}
    if settled:
        listed = ", ".join(f"{workflow.label(k)}={v}" for k, v in settled.items())
        lines.append(f"Already collected: {listed} — do not ask for these again.")
    if changing:
        current = ", ".join(f"{workflow.label(k)}={known[k]}" for k in changing)
        lines.append(f"The user went back to change {current}; ask only for the new value.")
    if spec.collects or spec.asks_next_missing:
        still = [
            workflow.label(s)
            for g in workflow.gathering_states
            for s in workflow.specs[g].collects
            if s not in known and s not in changing
        ]
        if still:
            lines.append(f"Still needed: {', '.join(still)}.")
    question = workflow.next_question(state, data)
    if question:
        lines.append(f"Next question: {question}")
    if refused:
        reasons = "; ".join(workflow.refusal_text(e) for e in refused)
        ask = " Then ask for it again." if question else ""
        lines.append(f"{REFUSED_PREFIX} {reasons}. Tell the user briefly that it was not used, and why.{ask}")
    lines.append(f"COLLECTED: {json.dumps(known, sort_keys=True, default=str)}")
    return "\n".join(lines)


def decision_messages(
    workflow: Workflow,
    *,
    state: str,
    data: Mapping[str, Any],
    user_message: str,
    recent_turns: list[tuple[str, str]],
) -> list[dict[str, Any]]:
    """The prompt of the structured call that returns a ``decision_schema`` instance for this turn."""
    allowed = sorted(workflow.transitions.get(state, frozenset()) | {state})
    slots_help = ", ".join(
        f"{name} ({f.description or f.annotation})" for name, f in workflow.slots_model.model_fields.items()
    )
    system = "\n".join(
        [
            f"You track the state of the '{workflow.title}' workflow. Do not answer the user; only decide.",
            f"WORKFLOW: {workflow.name}",
            f"CURRENT_STATE: {state}",
            f"ALLOWED_NEXT_STATES: {', '.join(allowed)}",
            f"COLLECTED: {json.dumps(dict(data), sort_keys=True, default=str)}",
            f"Slots: {slots_help}.",
            "Put in `slots` only values the user stated in the latest message (dates as YYYY-MM-DD); "
            "leave the rest null. Choose `next_state` from ALLOWED_NEXT_STATES: the first step whose "
            "information is still missing, or the confirmation step when everything is known.",
            f"Current step: {_instruction(workflow, state, data)}",
            *_recovery_lines(workflow, state),
        ]
    )
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for user_text, assistant_text in recent_turns:
        messages.append({"role": "user", "content": user_text})
        if assistant_text:
            messages.append({"role": "assistant", "content": assistant_text})
    messages.append({"role": "user", "content": user_message})
    return messages


# The first and last lines of the guide a turn that decides inside its reply's call adds to the workflow section
# (``decided_reply_guide``); a reader of the prompt (the demo model) finds it, and the section, between them.
GUIDE_START = "DECIDE, THEN REPLY (one JSON object):"
GUIDE_END = "END OF DECIDE, THEN REPLY."


def decided_reply_guide(workflow: Workflow, *, state: str, data: Mapping[str, Any]) -> str:
    """How to decide this turn and then reply in the state chosen, in one JSON object (the decision's fields
    first, ``reply`` last): the states allowed next, the slots, and what each allowed state's reply does."""
    allowed = sorted(workflow.transitions.get(state, frozenset()) | {state})
    slots_help = ", ".join(
        f"{name} ({f.description or f.annotation})" for name, f in workflow.slots_model.model_fields.items()
    )
    lines = [
        GUIDE_START,
        f"ALLOWED_NEXT_STATES: {', '.join(allowed)}",
        f"Slots: {slots_help}.",
        "First the decision: put in `slots` only values the user stated in the latest message (dates as "
        "YYYY-MM-DD), the rest null; choose `next_state` from ALLOWED_NEXT_STATES: the first step whose "
        "information is still missing, or the confirmation step when everything is known; `wants_person` true "
        "only when the user asks for a person.",
        *_recovery_lines(workflow, state),
        "Then `reply`: your answer to the user in the state you chose. What each state's reply does:",
    ]
    for target in allowed:
        action = " (an action runs first: leave `reply` empty)" if target in workflow.action_states else ""
        question = workflow.next_question(target, data)
        asks = f" Ask: {question}" if question and not action else ""
        lines.append(f"- {target}: {_instruction(workflow, target, data)}{action}{asks}")
    lines.append(GUIDE_END)
    return "\n".join(lines)


def _instruction(workflow: Workflow, state: str, data: Mapping[str, Any]) -> str:
    fields = _Defaulting({k: v for k, v in data.items() if v not in (None, "")})
    if workflow.describe is not None:
        fields.update(workflow.describe(data))
    return workflow.specs[state].instruction.format_map(fields)


def _recovery_lines(workflow: Workflow, state: str) -> list[str]:
    # In an action state, a turn starts only after an attempt that did not succeed (a success leaves the
    # state): repeating it unchanged is how a booking without seats looped to the failed state.
    recovery = workflow.recovery_state(state)
    if recovery is None:
        return []
    return [
        f"If the conversation shows that the last attempt of this step failed, choose {recovery} to fix it "
        "with the user (what was collected is kept); stay in this step only with a change that fixes the "
        "failure, or to retry after a temporary failure (a timeout, a service down); choose "
        f"{workflow.initial_state} only when the user asks to start over."
    ]


class _Defaulting(dict[str, Any]):
    """``str.format_map`` helper: unknown slots render as "?" instead of raising."""

    def __missing__(self, key: str) -> str:
        return "?"
