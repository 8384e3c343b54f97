"""Teach the offline demo model the booking workflow, so it can be walked end to end with no LLM.

Two handlers, registered with ``llm.demo`` when the agents app is ready:

- ``booking_decision``: the structured decision of each booking turn. It reads ``CURRENT_STATE`` and
  ``COLLECTED`` from the decision prompt, takes slot values from the user's words with real parsers
  (``slot_parsing``) and proposes the next state by the workflow's own rule: the first state whose
  slot is still missing, or CONFIRMING when everything is known.
- ``booking_reply``: the reply. It reads the resume instruction in the system prompt and answers with a
  short acknowledgement and the ``Next question``; it summarizes in CONFIRMING, calls ``book_flight``
  in BOOKING, and reports the tool's result. It declines (``None``) any prompt that is not a booking one.

A booking that fails is reported with its reason and the way out (the flights that have the seats, fewer
passengers); in BOOKING the next message's change is booked at once, while "try again" with nothing changed
goes back to CONFIRMING (the action's failure outcome) instead of failing the same way until FAILED.

The decision still goes through ``transition_apply``; nothing here bypasses the workflow's checks.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from datetime import date
from typing import Any

from django.utils import timezone

from agents.workflows.demo import message_text, turn_tool_results
from agents.workflows.prompts import QUESTION_LINE, REFUSED_LINE, collected_in
from examples.booking.slot_parsing import extract_slots
from examples.booking.workflow import FLIGHT_BOOKING, BookingDecision, trip_summary
from llm.base import Message, ToolCallRequest, ToolSpec
from llm.demo import DemoReply, asks_for_person, register_reply_handler, register_structured_handler

_STATE_LINE = re.compile(r"^CURRENT_STATE:\s*(\w+)\s*$", re.MULTILINE)
_WORKFLOW_LINE = re.compile(rf"^WORKFLOW:\s*{FLIGHT_BOOKING.name}\b", re.MULTILINE)

_START_OVER = re.compile(
    r"\b(?:start (?:over|again|afresh)|restart|from scratch|reset|new (?:booking|trip|flight)|"
    r"another (?:booking|trip|flight)|book another)\b",
    re.IGNORECASE,
)
_CONFIRM = re.compile(
    r"^\W*(?:yes|yeah|yep|yup|sure|ok(?:ay)?|correct|confirm(?:ed)?|go ahead|book it|do it|please do|"
    r"sounds good|that'?s (?:right|correct)|looks good|perfect)\b",
    re.IGNORECASE,
)
_RESUME = re.compile(r"\b(?:resume|continue|pick up|carry on|where we left|try again|retry)\b", re.IGNORECASE)
# "change the dates" → the back-edge to the state that asks for them.
_CHANGE_TARGETS = (
    (re.compile(r"\b(?:origin|departure (?:city|airport)|from where|leaving from)\b", re.I), "GATHERING_ORIGIN"),
    (re.compile(r"\b(?:destination|arrival|going to|where to)\b", re.I), "GATHERING_DESTINATION"),
    (re.compile(r"\b(?:dates?|day|when|departure date|return date)\b", re.I), "GATHERING_DATES"),
    (re.compile(r"\b(?:passengers?|people|travell?ers?|how many|tickets?)\b", re.I), "GATHERING_PASSENGERS"),
)
_CHANGE = re.compile(r"\b(?:change|wrong|different|instead|actually|update|modify|fix|edit)\b", re.IGNORECASE)

# The first words of the reply to a failed booking; the next turn's decision reads them back.
BOOKING_FAILED = "The booking did not go through:"

_LABELS = {
    "origin": "from",
    "destination": "to",
    "depart_date": "departing",
    "return_date": "returning",
    "passengers": "passengers",
}


def _system_text(messages: list[Message]) -> str:
    return "\n".join(message_text(m) for m in messages if m.get("role") == "system")


def _last_user_text(messages: list[Message]) -> str:
    return next((message_text(m) for m in reversed(messages) if m.get("role") == "user"), "")


def read_prompt_state(text: str) -> tuple[str, dict[str, Any]] | None:
    """(state, collected data) from the machine-readable lines of a booking prompt, else None."""
    if not _WORKFLOW_LINE.search(text):
        return None
    state_match = _STATE_LINE.search(text)
    if not state_match or state_match.group(1) not in FLIGHT_BOOKING.specs:
        return None
    return state_match.group(1), collected_in(text)


# --- the structured decision ----------------------------------------------------------------------------
def propose_decision(
    *, state: str, collected: Mapping[str, Any], user_message: str, today: date, last_reply: str = ""
) -> BookingDecision:
    """The demo's decision for one user message in ``state`` with ``collected`` data (see module docstring);
    ``last_reply``: the assistant's previous reply (a failed booking says so)."""
    workflow = FLIGHT_BOOKING
    spec = workflow.specs[state]
    asking = workflow.asked_slots(state, collected)
    slots = extract_slots(user_message, asking=asking, today=today, current=collected)
    merged, _errors = workflow.merge_slots(collected, slots, today=today)
    accepted = {k: v for k, v in slots.items() if merged.get(k) == v}

    if asks_for_person(user_message):
        return BookingDecision.model_validate(
            {
                "next_state": state,
                "slots": {},
                "confidence": 0.9,
                "reasoning": "asks for a person",
                "wants_person": True,
            }
        )

    def decide(next_state: str, why: str, *, keep_slots: bool = True) -> BookingDecision:
        # Every value the message states goes into the decision, as a model's would: the workflow refuses
        # the invalid ones (a date in the past, 15 passengers) and the reply explains them. ``accepted``
        # (what the workflow will keep) is what the choice of the next state looks at.
        return BookingDecision.model_validate(
            {
                "next_state": next_state,
                "slots": slots if keep_slots else {},
                "confidence": 0.9,
                "reasoning": why,
            }
        )

    if _START_OVER.search(user_message) and state != workflow.initial_state:
        return decide(workflow.initial_state, "the user wants to start over", keep_slots=False)
    if state == "BOOKING":
        if any(collected.get(k) != v for k, v in accepted.items()):
            # "Make it 1 passenger", "QK7431": the way out the failed attempt offered. A change of mind is always
            # shown and asked again: the new summary, "Shall I book it?".
            return decide("CONFIRMING", "a change after the failed booking: confirm it again")
        recovery = workflow.recovery_state(state)
        if BOOKING_FAILED in last_reply and recovery is not None:
            # Nothing changed: the same call would fail the same way (and count towards FAILED).
            return decide(recovery, "the booking failed and nothing changed: back to fix it", keep_slots=False)
        return decide("BOOKING", "the booking tool decides the outcome", keep_slots=False)
    if state == "COMPLETED":
        # The booked trip is final: later words ("I am allergic to peanuts") are not read as its details.
        return decide("COMPLETED", "the trip is booked", keep_slots=False)
    if state == "CONFIRMING":
        if accepted:
            return decide("CONFIRMING", "the user changed details; confirm again")
        if set(slots) - set(accepted):
            # "Yes, but for 15 passengers": the change was refused, so this is not a yes to the trip as it is.
            return decide("CONFIRMING", "a change the workflow refused; confirm again")
        if _CONFIRM.search(user_message) and not _CHANGE.search(user_message):
            return decide("BOOKING", "the user confirmed")
        # Only an explicit change request goes back ("change the dates"); a question that merely
        # mentions a day or a ticket does not.
        if _CHANGE.search(user_message):
            for pattern, target in _CHANGE_TARGETS:
                if pattern.search(user_message):
                    return decide(target, f"the user wants to change what {target} asks")
        return decide("CONFIRMING", "still waiting for a yes or a change")
    if state == "FAILED":
        return decide(workflow.first_missing_state(merged), "resume from what is already known")
    provided = set(accepted) & set((*spec.collects, *spec.accepts))
    if spec.collects and not provided and all(merged.get(s) not in (None, "") for s in spec.collects):
        # Back here to change a value, and no new value yet: keep asking instead of skipping ahead.
        return decide(state, "waiting for the new value")
    target = workflow.first_missing_state(merged)
    why = "everything is known" if target == workflow.complete_state else f"{target} is the first step still missing"
    return decide(target, why)


def booking_decision(messages: list[Message]) -> BookingDecision | None:
    """Structured handler for ``BookingDecision`` (registered with the demo model)."""
    found = read_prompt_state(_system_text(messages))
    if found is None:
        return None
    state, collected = found
    last_reply = next((message_text(m) for m in reversed(messages) if m.get("role") == "assistant"), "")
    return propose_decision(
        state=state,
        collected=collected,
        user_message=_last_user_text(messages),
        today=timezone.localdate(),
        last_reply=last_reply,
    )


# --- the reply ------------------------------------------------------------------------------------------
def _acknowledge(user_message: str, state: str, collected: Mapping[str, Any]) -> str:
    asking = FLIGHT_BOOKING.asked_slots(state, collected)
    said = extract_slots(user_message, asking=asking, today=timezone.localdate())
    noted = [f"{_LABELS.get(k, k)} {v}" for k, v in said.items() if k in collected and collected[k] == v]
    return f"Got it: {', '.join(noted)}." if noted else ""


def _book_call(collected: Mapping[str, Any]) -> ToolCallRequest:
    args = {
        k: collected[k]
        for k in ("origin", "destination", "depart_date", "return_date", "passengers", "flight_number")
        if collected.get(k) not in (None, "")
    }
    arguments = json.dumps(args, sort_keys=True)
    call_id = "call_demo_" + hashlib.sha256(arguments.encode()).hexdigest()[:12]
    return ToolCallRequest(id=call_id, name="book_flight", arguments=arguments)


def _report_tool(result: str) -> str:
    if result.startswith("TOOL_ERROR"):
        reason = result.split(":", 1)[1].strip() if ":" in result else result
        reason = reason.removeprefix("book_flight could not use these arguments:").strip().rstrip(".")
        if "seats" in reason or "full" in reason:
            # The example is a flight the error offered (the ones with the seats), not one made up.
            offered = re.findall(r"\b[A-Z]{2}\d{3,4}\b", reason.split("Flights that day:", 1)[-1])
            example = f" (for example “{offered[-1]}”)" if offered else ""
            way_out = (
                f"Tell me which flight to book instead{example}, or change the number of passengers "
                "(for example “make it 1 passenger”); or say “start over”."
            )
        else:
            way_out = "Tell me what to change, say “try again”, or “start over”."
        return f"{BOOKING_FAILED} {reason}. Nothing was booked. {way_out}"
    if result.startswith("Booked. "):
        # The tool's own account: the reference, the flight, its times, the passengers and the price.
        details = result.removeprefix("Booked. ")  # "reference X: flight QK7431 London → Paris, departs …"
        return f"Your flight is booked. Booking {details}" if details.startswith("reference") else f"Booked. {details}"
    reference = ""
    try:
        payload = json.loads(result)
        if isinstance(payload, dict):
            reference = str(payload.get("reference") or "")
    except ValueError:
        match = re.search(r"\b[A-Z0-9]{5,12}\b", result)
        reference = match.group(0) if match else ""
    return f"Your flight is booked. Booking reference: {reference}." if reference else f"Done: {result}"


def booking_reply(messages: list[Message], tools: list[ToolSpec] | None) -> DemoReply | None:
    """Reply handler for booking prompts (registered with the demo model); ``None`` for anything else."""
    found = read_prompt_state(_system_text(messages))
    if found is None:
        return None
    state, collected = found
    results = turn_tool_results(messages)
    if results:
        return DemoReply(text=_report_tool(results[-1]))
    user_message = _last_user_text(messages)
    tool_names = {t.name for t in tools or []}
    if state == "BOOKING":
        if "book_flight" in tool_names:
            return DemoReply(text="", tool_calls=[_book_call(collected)])
        return DemoReply(text="I am ready to book, but the booking tool is not enabled for this agent.")
    if state == "COMPLETED":
        ref = collected.get("booking_reference", "")
        return DemoReply(
            text=f"Your trip ({trip_summary(collected)}) is booked, reference {ref}. "
            "Would you like to book another trip?"
        )
    refused = REFUSED_LINE.search(_system_text(messages))
    not_used = f"I could not use that: {refused.group(1)}." if refused else ""
    if state == "CONFIRMING":
        confirm = (
            f"Here is your trip: {trip_summary(collected)}. Shall I book it? (Say yes, or tell me what to change.)"
        )
        last_reply = next((message_text(m) for m in reversed(messages) if m.get("role") == "assistant"), "")
        said = extract_slots(user_message, today=timezone.localdate(), current=collected)
        changed = any(collected.get(k) == v for k, v in said.items())
        if BOOKING_FAILED in last_reply and not changed:
            # Back from a failed booking with nothing changed: booking it as it is would fail the same way.
            why = last_reply.split(BOOKING_FAILED, 1)[1].split(" Nothing was booked.", 1)[0].strip()
            confirm = (
                f"Nothing has changed, so booking it again would fail the same way: {why} "
                f"Here is your trip: {trip_summary(collected)}. Tell me which flight to book or how many "
                "passengers, or say “start over”."
            )
        return DemoReply(text=f"{not_used} {confirm}".strip())
    if state == "FAILED":
        known = trip_summary(collected) if collected else "nothing yet"
        return DemoReply(
            text="Sorry — something went wrong several times, so I stopped. "
            f"What I have so far: {known}. Would you like to pick up where we left off, or start over?"
        )
    question = QUESTION_LINE.search(_system_text(messages))
    if question:
        ack = _acknowledge(user_message, state, collected)
        return DemoReply(text=" ".join(p for p in (not_used, ack, question.group(1)) if p))
    # A booking prompt with nothing to ask (say, restored by an operator with every detail known).
    return DemoReply(text=f"Here is what I have: {trip_summary(collected)}. What would you like to do next?")


def register() -> None:
    """Register both handlers with the demo model (idempotent)."""
    register_structured_handler(BookingDecision, booking_decision)
    register_reply_handler(booking_reply)
