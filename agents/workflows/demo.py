"""The offline demo model on any declared workflow: its decision and its reply, read from the declaration.

The demo model is not a language model, but a workflow says enough to walk it: which slots the current state
asks for, their types and rules (a pattern, choices, a date, a number), where each state leads and what it
needs. So, with no script of its own for the workflow (the booking example has one):

- ``demo_decision`` reads the slot values it can find in the user's message (a value matching a slot's pattern
  or one of its choices anywhere; a number, a yes or no, a date or free text only for the slot asked for),
  and proposes the workflow's own next step: the first state still missing something, the step after the
  confirmation on a yes, the state a failed action is fixed in, the initial state on "start over". It asks
  for a person when the user does. ``Workflow.step`` still checks every value and transition.
- ``workflow_reply`` answers from the workflow section of the prompt: what was refused and why, what was
  noted, and the state's question; it calls an action state's tool with the collected data and reports its
  result. It never quotes the prompt's machine lines (``WORKFLOW: …``, ``COLLECTED: …``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from django.utils import timezone
from pydantic import BaseModel

from agents.workflows.base import Workflow, WorkflowDecision, workflow_of
from agents.workflows.prompts import GUIDE_END, GUIDE_START, QUESTION_LINE, REFUSED_LINE, collected_in
from llm.base import Message, ToolCallRequest, ToolSpec
from llm.demo import DemoReply, asks_for_person, requested_schema

# What the demo's reply says when an action's tool failed; its next decision reads it back from the turn.
FAILED_ATTEMPT = "That did not work:"

_STATE_LINE = re.compile(r"^CURRENT_STATE:\s*(\S+)\s*$", re.MULTILINE)

_START_OVER = re.compile(r"\b(?:start (?:over|again|afresh)|restart|from scratch|reset)\b", re.IGNORECASE)
_YES = re.compile(
    r"^\W*(?:yes|yeah|yep|yup|sure|ok(?:ay)?|correct|confirm(?:ed)?|go ahead|do it|please do|sounds good|"
    r"that'?s (?:right|correct)|looks good|perfect|right)\b",
    re.IGNORECASE,
)
_NO = re.compile(r"^\W*(?:no|nope|not really|wrong)\b", re.IGNORECASE)
_CHANGE = re.compile(r"\b(?:change|wrong|different|instead|actually|update|modify|fix|edit)\b", re.IGNORECASE)
_RETRY = re.compile(r"\b(?:try again|retry|again)\b", re.IGNORECASE)
# Words that introduce a free-text answer ("it's about my invoice", "because it leaks").
_LEAD_IN = re.compile(
    r"^\W*(?:(?:well|so|um+|uh+)[, ]+)?(?:(?:it'?s|it is|this is)\s+(?:about|regarding|because)\s+|"
    r"(?:the reason is(?: that)?|because|about|regarding)\s+)",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")
_NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
_ISO_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


@dataclass(frozen=True)
class SlotKind:
    """What the demo can tell about a slot from its JSON schema: its type, and a pattern or choices."""

    type: str
    pattern: str = ""
    choices: tuple[str, ...] = ()
    format: str = ""


def slot_kinds(slots_model: type[BaseModel]) -> dict[str, SlotKind]:
    """Each slot of ``slots_model`` as the demo reads it (from the model's JSON schema, so a slot declared in code
    and one declared as data read alike)."""
    properties = slots_model.model_json_schema().get("properties", {})
    kinds: dict[str, SlotKind] = {}
    for name, schema in properties.items():
        options = [o for o in schema.get("anyOf", [schema]) if o.get("type") != "null"]
        first = options[0] if options else {}
        choices = tuple(str(c) for c in first.get("enum", ())) or ((str(first["const"]),) if "const" in first else ())
        kinds[name] = SlotKind(
            type=str(first.get("type", "string")),
            pattern=str(first.get("pattern", "")),
            choices=choices,
            format=str(first.get("format", "")),
        )
    return kinds


# --- reading slots -------------------------------------------------------------------------------------------
def read_slots(
    workflow: Workflow, *, state: str, data: Mapping[str, Any], message: str, today: date | None = None
) -> dict[str, Any]:
    """The slot values the demo reads in ``message`` (see the module docstring); not yet checked."""
    spec = workflow.specs[state]
    asked = [*workflow.asked_slots(state, data), *spec.accepts]
    kinds = slot_kinds(workflow.slots_model)
    found: dict[str, Any] = {}
    for name, kind in kinds.items():
        value = _distinctive_value(kind, message, today=today or timezone.localdate())
        if value is None and name in asked:
            value = _asked_value(kind, message, free_text=_only_free_text(name, asked, kinds))
        if value is not None and value != data.get(name):
            found[name] = value
    return found


def _distinctive_value(kind: SlotKind, message: str, *, today: date) -> Any:
    """A value that can only be meant for this slot: one matching its pattern, one of its choices, a date."""
    if kind.pattern:
        return _pattern_value(kind.pattern, message)
    if kind.choices:
        return next(
            (c for c in kind.choices if re.search(rf"(?<!\w){re.escape(c)}(?!\w)", message, re.IGNORECASE)), None
        )
    if kind.format == "date":
        iso = _ISO_DATE.search(message)
        if iso:
            return iso.group(0)
        if re.search(r"\btomorrow\b", message, re.IGNORECASE):
            return (today + timedelta(days=1)).isoformat()
        if re.search(r"\btoday\b", message, re.IGNORECASE):
            return today.isoformat()
    return None


def _pattern_value(pattern: str, message: str) -> str | None:
    # The pattern searched for inside the message ("Order A1001, please"), then held to the whole pattern.
    loose = pattern.removeprefix("^").removesuffix("$")
    try:
        whole, inside = re.compile(pattern), re.compile(loose)
    except re.error:
        return None
    for match in inside.finditer(message):
        value = match.group(0).strip()
        start = match.start() + match.group(0).index(value) if value else match.start()
        if value and whole.fullmatch(value) and _stands_alone(message, start, start + len(value)):
            return value
    return None


def _stands_alone(message: str, start: int, end: int) -> bool:
    # "A1001" in "A10012" is not the order A1001.
    before = message[start - 1] if start > 0 else " "
    after = message[end] if end < len(message) else " "
    return not (before.isalnum() or after.isalnum())


def _asked_value(kind: SlotKind, message: str, *, free_text: bool) -> Any:
    """A value for the slot the question asked: a number, a yes or no, free text; or, for a slot with a pattern
    the answer does not match, the answer's likeliest word, so that the refusal says why."""
    text = message.strip()
    if kind.type in ("integer", "number"):
        number = _NUMBER.search(text)
        if number:
            return int(number.group(0)) if kind.type == "integer" else float(number.group(0))
        word = next((w for w in re.findall(r"[a-z]+", text.lower()) if w in _NUMBER_WORDS), None)
        return _NUMBER_WORDS[word] if word is not None else None
    if kind.type == "boolean":
        return True if _YES.search(text) else False if _NO.search(text) else None
    if kind.pattern:
        words = [w.strip(".,;:!?\"'()") for w in text.split()]
        return next((w for w in reversed(words) if any(ch.isdigit() for ch in w)), None)
    if kind.type == "string" and not kind.choices and free_text and not _is_only_chatter(text):
        answer = _LEAD_IN.sub("", text).strip().rstrip(".!").strip()
        return answer or None
    return None


def _only_free_text(name: str, asked: Sequence[str], kinds: Mapping[str, SlotKind]) -> bool:
    # The whole message can answer one free-text question, not two at once.
    free = [s for s in asked if kinds[s].type == "string" and not kinds[s].pattern and not kinds[s].choices]
    return free == [name]


def _is_only_chatter(text: str) -> bool:
    return bool(
        _YES.fullmatch(text.strip(" .!"))
        or _NO.fullmatch(text.strip(" .!"))
        or re.fullmatch(r"\W*(?:hi|hello|hey|thanks|thank you|ok|okay)\W*", text, re.IGNORECASE)
        or asks_for_person(text)
        or _START_OVER.search(text)
    )


# --- the decision ----------------------------------------------------------------------------------------
def propose(
    workflow: Workflow,
    *,
    state: str,
    data: Mapping[str, Any],
    message: str,
    last_reply: str = "",
    today: date | None = None,
) -> tuple[str, dict[str, Any], str]:
    """(next state, slots read, why) for ``message`` in ``state`` with ``data`` (see the module docstring)."""
    if _START_OVER.search(message) and state != workflow.initial_state:
        if workflow.can_transition(state, workflow.initial_state):
            return workflow.initial_state, {}, "the user wants to start over"
    if state in workflow.terminal_states:
        return state, {}, "finished; only starting over changes it"
    slots = read_slots(workflow, state=state, data=data, message=message, today=today)
    merged, _errors = workflow.merge_slots(data, slots, today=today)
    accepted = {k for k, v in slots.items() if merged.get(k) == v and data.get(k) != v}
    spec = workflow.specs[state]

    if state in workflow.action_states:
        recovery = workflow.recovery_state(state)
        if accepted:
            return state, slots, "a change that may fix the failed attempt: try it"
        if recovery is not None and FAILED_ATTEMPT in last_reply:
            return recovery, slots, "the last attempt failed and nothing changed: fix it with the user"
        return state, slots, "try the step again"
    if state == workflow.complete_state:
        if accepted or set(slots) - accepted:
            return state, slots, "the user changed details (or tried to); confirm again"
        if _YES.search(message) and not _CHANGE.search(message):
            target = _after_confirming(workflow, state, merged)
            if target is not None:
                return target, slots, "the user confirmed"
        if _CHANGE.search(message) or _NO.search(message):
            target = _state_asking_about(workflow, state, message)
            if target is not None:
                return target, slots, f"the user wants to change what {target} asks"
        return state, slots, "waiting for a yes or a change"
    if spec.collects or spec.asks_next_missing:
        provided = accepted & {*spec.collects, *spec.accepts}
        if spec.collects and not provided and all(merged.get(s) not in (None, "") for s in spec.collects):
            return state, slots, "back here to change a value: waiting for the new one"
        return _forward(workflow, state, merged), slots, "the first step still missing something"
    return state, slots, "nothing in this step to move on"


def _forward(workflow: Workflow, state: str, data: Mapping[str, Any]) -> str:
    """The first state still missing something (the confirmation when nothing is), or the furthest gathering
    state the table allows from here; else stay."""
    target = workflow.first_missing_state(data)
    if _may_enter(workflow, state, target, data):
        return target
    for candidate in workflow.gathering_states:
        missing = any(data.get(s) in (None, "") for s in workflow.specs[candidate].collects)
        if missing and _may_enter(workflow, state, candidate, data):
            return candidate
    return state


def _may_enter(workflow: Workflow, state: str, target: str, data: Mapping[str, Any]) -> bool:
    return workflow.can_transition(state, target) and not workflow.missing_for(target, data)


def _after_confirming(workflow: Workflow, state: str, data: Mapping[str, Any]) -> str | None:
    """The step a yes leads to from the confirmation: an action first, else any state onwards."""
    onwards = [
        s
        for s in workflow.states
        if s in workflow.transitions.get(state, frozenset())
        and s not in (state, workflow.initial_state, workflow.failed_state)
        and s not in workflow.gathering_states
        and _may_enter(workflow, state, s, data)
    ]
    return next((s for s in onwards if s in workflow.action_states), onwards[0] if onwards else None)


def _state_asking_about(workflow: Workflow, state: str, message: str) -> str | None:
    """The gathering state whose slot the message names ("change the reason"), where the table allows it."""
    lowered = message.lower()
    for target in workflow.gathering_states:
        for slot in workflow.specs[target].collects:
            words = {slot.replace("_", " "), workflow.label(slot).lower(), slot.split("_")[-1]}
            if any(re.search(rf"\b{re.escape(w)}\b", lowered) for w in words) and workflow.can_transition(
                state, target
            ):
                return target
    return None


def demo_decision(messages: Sequence[Mapping[str, Any]]) -> WorkflowDecision | None:
    """The demo model's decision for a workflow with no script of its own (registered for ``WorkflowDecision``;
    a workflow's own handler, for a subclass, takes precedence). None for a prompt that is not a decision's."""
    system = next((message_text(m) for m in messages if m.get("role") == "system"), "")
    current = _STATE_LINE.search(system)
    if current is None:
        return None
    user = next((message_text(m) for m in reversed(messages) if m.get("role") == "user"), "")
    state = current.group(1)
    workflow = workflow_of(requested_schema())
    if asks_for_person(user) or workflow is None or state not in workflow.specs:
        # Asking for a person is the decision's ``wants_person``: the turn hands off, the state stays.
        return _stay(state, wants_person=asks_for_person(user))
    last_reply = next((message_text(m) for m in reversed(messages) if m.get("role") == "assistant"), "")
    target, slots, why = propose(workflow, state=state, data=collected_in(system), message=user, last_reply=last_reply)
    decision: WorkflowDecision = workflow.decision_schema.model_validate(
        {"next_state": target, "slots": slots, "confidence": 0.9, "reasoning": f"demo model: {why}"}
    )
    return decision


class _NoSlotsRead(BaseModel):
    """The demo model's slot update when it cannot tell the workflow (pydantic refuses a bare ``BaseModel()``)."""


def _stay(state: str, *, wants_person: bool) -> WorkflowDecision:
    return WorkflowDecision(
        next_state=state, slots=_NoSlotsRead(), reasoning="demo model: it stays", wants_person=wants_person
    )


# --- the reply after a decision in the same call ------------------------------------------------------------
# The workflow section of a prompt (its first line to its COLLECTED line), and the guide a turn that decides inside
# its reply's call adds after it (``prompts.decided_reply_guide``).
_SECTION = re.compile(r"^WORKFLOW: .*?^COLLECTED: [^\n]*$", re.MULTILINE | re.DOTALL)
_GUIDE = re.compile(rf"\s*^{re.escape(GUIDE_START)}.*?^{re.escape(GUIDE_END)}$", re.MULTILINE | re.DOTALL)


def reply_prompt_after(messages: list[Message], decision: BaseModel) -> list[Message] | None:
    """The demo model's reply prompt after ``decision`` in a prompt that asks for both (registered with
    ``llm.demo.register_reply_prompt_handler``): the same messages, the guide left out and the workflow section as
    the separate reply's prompt would hold it once the decision is applied, so that one call answers as two would.
    None for a prompt that holds no guide."""
    workflow = workflow_of(requested_schema())
    first = messages[0] if messages and messages[0].get("role") == "system" else None
    system = message_text(first) if first is not None else ""
    current = _STATE_LINE.search(system)
    if workflow is None or GUIDE_START not in system or current is None or current.group(1) not in workflow.specs:
        return None
    state, data = current.group(1), collected_in(system)
    step = workflow.step(
        state=state, data=data, decision=workflow.decision_schema.model_validate(decision.model_dump())
    )
    section = workflow.resume_instruction(
        step.to_state if step.applied else state, step.data if step.applied else data, refused=step.slot_errors
    )
    text = _SECTION.sub(lambda _match: section, _GUIDE.sub("", system), count=1)
    return [{**messages[0], "content": text}, *messages[1:]]


# --- the reply -------------------------------------------------------------------------------------------
def workflow_reply(messages: list[Message], tools: list[ToolSpec] | None) -> DemoReply | None:
    """The demo's reply in a workflow with no script of its own (registered as a fallback reply handler): the
    tool's result, the action's tool call, else what was refused, what was noted and the state's question.
    None for a prompt with no workflow step to answer from (a free chat keeps the default reply)."""
    system = "\n".join(message_text(m) for m in messages if m.get("role") == "system")
    if _STATE_LINE.search(system) is None:
        return None
    collected = collected_in(system)
    results = turn_tool_results(messages)
    if results:
        return DemoReply(text=_report_tool(results[-1]))
    forced = next((t for t in tools or [] if t.forced), None)
    if forced is not None:
        return _action_call(forced, collected)
    question = QUESTION_LINE.search(system)
    refused = REFUSED_LINE.search(system)
    if question is None and refused is None and not collected:
        return None
    user = next((message_text(m) for m in reversed(messages) if m.get("role") == "user"), "")
    parts = [f"I could not use that: {refused.group(1)}." if refused else "", _noted(user, collected)]
    if question is not None:
        parts.append(question.group(1))
    elif collected:
        parts.append(f"Here is what I have: {_listed(collected)}.")
    return DemoReply(text=" ".join(p for p in parts if p))


def _action_call(tool: ToolSpec, collected: Mapping[str, Any]) -> DemoReply:
    properties = tool.parameters.get("properties", {}) if isinstance(tool.parameters, dict) else {}
    required = tool.parameters.get("required", []) if isinstance(tool.parameters, dict) else []
    missing = [name for name in required if collected.get(name) in (None, "")]
    if missing:
        return DemoReply(text=f"I cannot do this step yet: I still need {', '.join(_words(m) for m in missing)}.")
    arguments = json.dumps({k: v for k, v in collected.items() if k in properties}, sort_keys=True)
    return DemoReply(
        text="", tool_calls=[ToolCallRequest(id=f"call_demo_{tool.name}", name=tool.name, arguments=arguments)]
    )


def _report_tool(result: str) -> str:
    if result.startswith("TOOL_ERROR"):
        reason = result.split(":", 1)[1].strip() if ":" in result else result
        return f"{FAILED_ATTEMPT} {reason.rstrip('.')}. Tell me what to change, or say “start over”."
    return result


def _noted(user: str, collected: Mapping[str, Any]) -> str:
    said = [f"{_words(k)} {v}" for k, v in collected.items() if str(v) and str(v).lower() in user.lower()]
    return f"Noted: {', '.join(said)}." if said else ""


def _listed(collected: Mapping[str, Any]) -> str:
    return ", ".join(f"{_words(k)} {v}" for k, v in collected.items())


def _words(slot: str) -> str:
    return slot.replace("_", " ")


def turn_tool_results(messages: list[Message]) -> list[str]:
    """The tool results of this turn: those after the latest user message."""
    results: list[str] = []
    for message in reversed(messages):
        if message.get("role") == "user":
            break
        if message.get("role") == "tool":
            results.append(message_text(message))
    return results[::-1]


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text: its content, or the text parts of a content list."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""
