"""The seed articles' naive agent, written the way they show it, for the failure gallery.

What makes it naive is the architecture, not the model:

- **append everything**: one prompt string, the whole conversation and every tool result added each turn
  (seed 000, section 2.1);
- **k=20 retrieval pasted into the prompt**: every past turn is "memorised" and the 20 nearest are pasted
  in, relevant or not (seed 000, section 2.2);
- **no state machine**: what has been collected lives only in the transcript the model reads;
- **tools without error handling**: no deadline, no retry, exceptions propagate (seed 004, "the fragile
  implementation");
- **string routing**: ``if "search" in decision.lower()`` picks the branch (seed 004, pattern 3).

Its model, ``NaiveModel``, is deterministic and behaves like the app's offline demo model: it reads slots
with the same parsers (``examples.booking.slot_parsing``), asks the same questions, summarises the trip in
the same words and reports tool results the same way (``search_reply``, ``booking_reply_text``). It has the
same 8,192-token window and, like a real API, refuses a longer prompt with ``context_length_exceeded``.
The faults the gallery injects into it (``ModelFault``) are the ones it injects into the app's model.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from examples.booking.slot_parsing import extract_slots
from examples.booking.workflow import FLIGHT_BOOKING, trip_summary
from llm.tokens import TokenCounter

# The slots a booking needs, in the order the workflow asks for them (return_date is optional).
REQUIRED_SLOTS: tuple[str, ...] = ("origin", "destination", "depart_date", "passengers")
SLOT_STATES: dict[str, str] = {
    "origin": "GATHERING_ORIGIN",
    "destination": "GATHERING_DESTINATION",
    "depart_date": "GATHERING_DATES",
    "passengers": "GATHERING_PASSENGERS",
}
# The workflow's own question texts: what both agents say when they ask for a slot.
SLOT_QUESTIONS: dict[str, tuple[str, ...]] = {
    slot: tuple(q for q in (FLIGHT_BOOKING.specs[state].question, FLIGHT_BOOKING.specs[state].change_question) if q)
    for slot, state in SLOT_STATES.items()
}
# A request to see flights ("which flights", "the flights", "any later flights"), not a mention of one.
FLIGHT_WORDS = re.compile(r"\b(?:which|the|any)\s+(?:\w+\s+)?flights\b", re.IGNORECASE)
CONFIRM = re.compile(r"^\W*(?:yes|yeah|yep|ok(?:ay)?|confirm(?:ed)?|go ahead|book it|please book)\b", re.IGNORECASE)
SYSTEM_PROMPT = (
    "You are a flight-booking assistant. Ask only for what is still missing, never for what is already "
    "collected, confirm before booking, and book with the book_flight tool."
)
ROUTE_INSTRUCTION = "Instruction: Decide the next action: search (look up flights), book (book the trip) or answer."


class ContextLengthExceeded(Exception):
    """What an API answers when the prompt is longer than the model's window."""

    code = "context_length_exceeded"


@dataclass
class ModelFault:
    """A model misbehaviour for one turn, injected identically into both agents' models.

    ``free_text``: the routing output is this free text ("Search", "検索する") instead of a valid choice.
    ``truncate``: the reply is cut off at half its length (finish reason ``length``), and a request to continue
    it is answered as ``truncate`` says (``CUT_CASES``: what real endpoints do). The naive agent never asks.
    """

    free_text: str = ""
    truncate: str = ""


# What an endpoint answers when asked to continue a reply it cut off (``llm.continuation``):
CUT_CASES = {
    "continued": "the rest of the reply",
    "cut_again": "the next part of the rest, cut off again",
    "empty": "nothing (finish reason stop)",
    "repeats": "what it said already, again (finish reason stop)",
}


@dataclass
class ModelReply:
    text: str
    finish_reason: str = "stop"


# --- what the model "understands": shared by the naive model and the app's stand-in --------------------
def asks_for_flights(message: str) -> bool:
    """The user asks to see flights (the model's reading of the message; the same for both agents)."""
    return bool(FLIGHT_WORDS.search(message))


def search_arguments(slots: dict[str, Any]) -> dict[str, Any] | None:
    """``search_flights`` arguments from what is known, or None when the route or the date is missing."""
    if not all(slots.get(k) for k in ("origin", "destination", "depart_date")):
        return None
    return {"origin": slots["origin"], "destination": slots["destination"], "date": slots["depart_date"]}


def search_reply(result: str) -> str:
    """How the model reports a flight search: the flights it was given, or the failure it was told about."""
    if result.startswith("TOOL_ERROR"):
        reason = result.split(":", 1)[1].strip() if ":" in result else result
        return f"I could not get the flights just now: {reason} Shall I try again in a moment?"
    lines = [line.strip() for line in result.splitlines() if line.strip()]
    flights = [line for line in lines if re.match(r"^\d+\.", line)]
    head = lines[0] if lines else "Flights:"
    return f"{head} " + " ".join(flights[:3]) + (f" (and {len(flights) - 3} more)" if len(flights) > 3 else "")


def booking_reply_text(result: str) -> str:
    """How the model reports ``book_flight``'s result (the demo handler's wording)."""
    match = re.search(r"reference ([A-Z0-9]{5,12})", result)
    return f"Your flight is booked. Booking reference: {match.group(1)}." if match else f"Done: {result}"


def asked_slots(reply: str) -> list[str]:
    """The booking slots a reply asks the user for (by the workflow's question texts)."""
    return [slot for slot, questions in SLOT_QUESTIONS.items() if any(q in reply for q in questions)]


def cut_in_half(text: str, counter: TokenCounter) -> str:
    """A reply cut off by the token limit: its first half, as a model hitting ``max_tokens`` returns it."""
    return counter.truncate(text, max(1, math.ceil(counter.count(text) / 2)))


# --- the naive model -----------------------------------------------------------------------------------
_TURN_LINE = re.compile(r"^(User|Assistant|Tool \(\w+\)|Instruction): ?(.*)$")


def transcript(prompt: str) -> list[tuple[str, str]]:
    """(speaker, text) pairs of the conversation section of a naive prompt, continuation lines joined."""
    section = prompt.split("\nConversation:\n", 1)[-1]
    turns: list[tuple[str, str]] = []
    for line in section.splitlines():
        match = _TURN_LINE.match(line)
        if match:
            turns.append((match.group(1), match.group(2)))
        elif turns:
            turns[-1] = (turns[-1][0], f"{turns[-1][1]}\n{line}")
    return turns


class NaiveModel:
    """A deterministic model for single-string prompts, behaving like the demo model (module docstring)."""

    def __init__(self, *, counter: TokenCounter, today: date, window: int = 8192, max_tokens: int = 512) -> None:
        self.counter = counter
        self.today = today
        self.window = window
        self.max_tokens = max_tokens
        self.fault = ModelFault()

    def prompt_tokens(self, prompt: str) -> int:
        # Sent as one user message, as llm.complete(prompt) does.
        return self.counter.count_messages([{"role": "user", "content": prompt}])

    def _accept(self, prompt: str) -> None:
        tokens = self.prompt_tokens(prompt)
        if tokens > self.window:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {self.window} tokens. "
                f"However, your messages resulted in {tokens} tokens."
            )

    def read_slots(self, prompt: str) -> dict[str, Any]:
        """The booking slots stated in the transcript, read message by message like the demo's parsers."""
        slots: dict[str, Any] = {}
        asking: tuple[str, ...] = ()
        for speaker, text in transcript(prompt):
            if speaker == "Assistant":
                asking = tuple(asked_slots(text))
                continue
            slots.update(extract_slots(text, asking=asking, today=self.today))
        return slots

    def route(self, prompt: str) -> str:
        """The routing call: free text naming the next action (or the injected free text)."""
        self._accept(prompt)
        if self.fault.free_text:
            return self.fault.free_text
        user = next((text for speaker, text in reversed(transcript(prompt)) if speaker == "User"), "")
        slots = self.read_slots(prompt)
        if asks_for_flights(user) and search_arguments(slots) is not None:
            return "search"
        if CONFIRM.search(user) and all(slots.get(s) for s in REQUIRED_SLOTS):
            return "book"
        return "answer"

    def reply(self, prompt: str, *, tool: str = "", tool_result: str = "") -> ModelReply:
        self._accept(prompt)
        if tool == "search_flights":
            text = search_reply(tool_result)
        elif tool == "book_flight":
            text = booking_reply_text(tool_result)
        else:
            text = self._answer(prompt)
        if self.fault.truncate:
            return ModelReply(cut_in_half(text, self.counter), finish_reason="length")
        return ModelReply(text)

    def _answer(self, prompt: str) -> str:
        slots = self.read_slots(prompt)
        booked = re.findall(r"Booking reference: ([A-Z0-9]{5,12})", prompt.split("\nConversation:\n", 1)[-1])
        if booked:
            return f"Your trip ({trip_summary(slots)}) is booked, reference {booked[-1]}. Would you like to book another trip?"
        missing = [s for s in REQUIRED_SLOTS if not slots.get(s)]
        if not missing:
            return f"Here is your trip: {trip_summary(slots)}. Shall I book it? (Say yes, or tell me what to change.)"
        return SLOT_QUESTIONS[missing[0]][0]


# --- the naive agent -----------------------------------------------------------------------------------
@dataclass
class NaiveTurn:
    reply: str | None  # None: the turn crashed (an exception reached the caller)
    branch: str  # the branch the string router chose ("" when it crashed before routing)
    prompt_tokens: int  # the largest prompt sent (or refused) in this turn
    prompt: str  # the last prompt the model was asked to read
    accepted: bool  # whether the model accepted that prompt
    finish_reason: str = "stop"
    error: str = ""


@dataclass
class NaiveAgent:
    """The seed's agent loop. ``tools`` maps a name to a function that may raise (nothing catches it)."""

    model: NaiveModel
    tools: dict[str, Callable[[dict[str, Any]], str]]
    embed: Callable[[list[str]], list[list[float]]]
    k: int = 20
    history: list[tuple[str, str, str]] = field(default_factory=list)  # (user, tool output, assistant)
    memories: list[tuple[str, list[float]]] = field(default_factory=list)

    def similarity_search(self, query: str) -> list[str]:
        """The k nearest stored turns by cosine similarity, pasted in whatever their relevance."""
        if not self.memories:
            return []
        [q] = self.embed([query])
        scored = sorted(((sum(a * b for a, b in zip(q, v, strict=False)), t) for t, v in self.memories), reverse=True)
        return [text for _, text in scored[: self.k]]

    def build_prompt(self, message: str) -> str:
        memories = "\n".join(f"- {m}" for m in self.similarity_search(message))
        prompt = f"{SYSTEM_PROMPT}\n\nRelevant Memories:\n{memories}\n\nConversation:\n"
        for user, tool_output, assistant in self.history:
            prompt += f"User: {user}\n" + tool_output + f"Assistant: {assistant}\n"
        return prompt + f"User: {message}\n"

    def handle(self, message: str) -> str:
        """One turn, exactly as naive code runs it: any exception propagates to the caller."""
        return self.run_turn(message, raise_errors=True).reply or ""

    def run_turn(self, message: str, *, raise_errors: bool = False) -> NaiveTurn:
        """One turn; with ``raise_errors=False`` an exception is recorded (as a crash) instead of raised."""
        prompt = self.build_prompt(message)
        record = NaiveTurn(
            reply=None, branch="", prompt_tokens=self.model.prompt_tokens(prompt), prompt=prompt, accepted=False
        )
        try:
            decision = self.model.route(prompt + ROUTE_INSTRUCTION + "\n")
            record.accepted = True
            # String routing, as in the seed: whatever mentions "search" searches, "book" books.
            if "search" in decision.lower():
                record.branch = "search"
                tool = "search_flights"
            elif "book" in decision.lower():
                record.branch = "book"
                tool = "book_flight"
            else:
                record.branch = "answer"
                tool = ""
            if tool:
                slots = self.model.read_slots(prompt)
                result = self.tools[tool](slots)  # no try/except: a tool failure ends the turn
                # The tool's output is appended to the prompt too, and stays in the history.
                tool_output = f"Tool ({tool}): {result}\n"
                prompt = prompt + tool_output
                record.prompt, record.accepted = prompt, False
                record.prompt_tokens = max(record.prompt_tokens, self.model.prompt_tokens(prompt))
                answer = self.model.reply(prompt, tool=tool, tool_result=result)
            else:
                tool_output = ""
                answer = self.model.reply(prompt)
            record.accepted = True
        except Exception as exc:
            if raise_errors:
                raise
            record.error = f"{type(exc).__name__}: {exc}"
            return record
        # No finish_reason check: a reply cut off by the token limit is used as if it were whole.
        record.reply, record.finish_reason = answer.text, answer.finish_reason
        self.history.append((message, tool_output, answer.text))
        [vector] = self.embed([f"User said: {message} Assistant said: {answer.text}"])
        self.memories.append((f"User said: {message} Assistant said: {answer.text}", vector))
        return record
