"""The seeds' failure gallery: the naive agent and this app through one scripted 60-turn conversation.

Both agents get the same user messages, the same injected faults and the same model behaviour:

- the app runs ``orchestrator.runtime.turn_run`` with the flight-booking agent on the offline demo model
  (``GalleryDemoModel``: the demo model plus the gallery's shared behaviour and faults);
- the naive agent (``bench.naive_agent``) runs the seed articles' loop on ``NaiveModel``, which behaves like
  the demo model. Both models have an 8,192-token window and refuse a longer prompt.

Faults (the same turns for both): search_flights 503 bursts, a 400, a timeout and a malformed payload (a
real ``KeyError``) through ``agents.tools.faults``; routing answered in free text ("Search", "search for more
information", "検索する"); four replies cut off by the token limit, whose continuations are answered each as a
real endpoint may answer one (``CUT_CASES``): the rest of the reply, a part of it cut off again, nothing, or
the same words again. The naive agent never asks for a continuation.

Measures: crashes (an exception reached the caller, or no reply), prompt tokens at turns 20/40/60 (tiktoken,
``llm.tokens``), repeated questions (a reply asks for a slot the user already gave), mis-routes (the
branch taken is not the one the message called for), cut-off replies shown as whole and kept marked (with
what the user got on each cut-off turn, judged apart from the app's own rules: ``_cut_outcome``), and lost
data (facts stated early that are in neither what the model read at the last turn nor the collected data).

``run_app`` takes another model too: ``gallery_real_model`` puts the same faults on a real OpenAI-compatible
endpoint (``tests/real_model/test_real_gallery.py``, in ``make test-llm``).

``python -m bench gallery [-- --turns N]`` runs it in a throwaway database, prints the table and writes
``bench/results/gallery.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from bench.naive_agent import (
    CUT_CASES,
    REQUIRED_SLOTS,
    ModelFault,
    NaiveAgent,
    NaiveModel,
    asked_slots,
    asks_for_flights,
    cut_in_half,
    search_arguments,
    search_reply,
)

RESULTS = Path(__file__).resolve().parent / "results"
WINDOW = 8192
CHECKPOINTS = (20, 40, 60)


@dataclass(frozen=True)
class ToolFault:
    tool: str
    kind: str
    times: int = 1


@dataclass(frozen=True)
class ScriptTurn:
    """One user message, what it calls for, what it states, and the faults injected on its turn."""

    text: str
    expect: str = "answer"  # the right branch: "answer", "search" or "book"
    gives: tuple[str, ...] = ()  # booking slots this message states
    tool_faults: tuple[ToolFault, ...] = ()
    model_fault: ModelFault = field(default_factory=ModelFault)

    def fault_label(self) -> str:
        labels = [f"{f.tool} {f.kind}" + (f"×{f.times}" if f.times > 1 else "") for f in self.tool_faults]
        if self.model_fault.free_text:
            labels.append(f"routing said {self.model_fault.free_text!r}")
        if self.model_fault.truncate:
            labels.append(f"reply cut off, continuation {self.model_fault.truncate}")
        return ", ".join(labels)


# Facts stated early, and the text that shows each one is still there (any marker counts).
FACTS: dict[str, tuple[str, ...]] = {
    "frequent flyer number": ("QX-4471",),
    "name": ("Dana Whitfield",),
    "allergy": ("peanuts",),
    "companion": ("Sam Ortega",),
    "origin": ("Lisbon",),
    "passengers": ('"passengers": 2', "2 passengers"),
}

EMAIL = (
    "Here is the email my old travel agent sent me last year, in case it helps: 'Dear Ms Whitfield, thank you, "
    "as always, and welcome back. As discussed on the phone, we keep your preferences on file: window seat, "
    "vegetarian option if nut-free is not available, a quiet hotel room away from the lift, and an airport "
    "transfer booked in advance. In Scandinavia we recommend packing layers, as the weather can change quickly, "
    "and most shops and taxis prefer card payments. Our office is open nine till six on weekdays; outside those "
    "hours please use the emergency line printed on your itinerary. We also suggest arriving at the airport two "
    "hours before departure on international routes, and checking the baggage rules of the operating carrier, "
    "which may differ. Kind regards, the travel team.' I do not use that agency any more, which is why I am "
    "asking you."
)
COMPLAINT = (
    "I have to say the last airline I flew with was a disaster and I want this trip to go better. The plane was "
    "late, nobody told us anything, the gate changed twice, the staff at the counter did not know which queue "
    "was ours, and by the time we boarded there was no space left in the cabin, so our bags went in the hold and "
    "one of them arrived damaged. The meal I had requested was not on board either, and with my allergy that is "
    "not a small thing: I ate nothing the whole flight. On the way back the online check-in did not work, the "
    "app crashed every time I opened the boarding pass, and the helpline kept me waiting forty minutes before "
    "the call dropped. I am telling you all this because I would rather pay a little more and have things work "
    "than save money and go through that again. Please make sure the special meal is really requested and that "
    "our seats are side by side."
)


def conversation(today: date) -> list[ScriptTurn]:
    """The scripted 60-turn booking conversation (dates relative to ``today`` so they stay in the future)."""
    depart = today + timedelta(days=95)
    back = depart + timedelta(days=7)

    def say(d: date) -> str:
        return d.strftime("%B %d %Y")

    def fault(tool: str, kind: str, times: int = 1) -> tuple[ToolFault, ...]:
        return (ToolFault(tool, kind, times),)

    return [
        ScriptTurn("Hi, my name is Dana Whitfield and my frequent flyer number is QX-4471."),
        ScriptTurn("I'd like to book a flight from Lisbon to Oslo.", gives=("origin", "destination")),
        ScriptTurn("I have a peanut allergy; peanuts make me very ill, so I always need a nut-free meal."),
        ScriptTurn(f"We fly out on {say(depart)} and come back on {say(back)}.", gives=("depart_date", "return_date")),
        ScriptTurn("Which flights are there on the outbound leg?", expect="search"),
        ScriptTurn("My partner Sam Ortega is travelling with me, he prefers the aisle seat."),
        ScriptTurn("What is the baggage allowance on this route?"),
        ScriptTurn(
            "Can you check the flights for the outbound leg again, please?",
            "search",
            (),
            fault("search_flights", "http_503", 2),
        ),
        ScriptTurn("How early should we be at the airport in Lisbon?"),
        ScriptTurn(EMAIL),
        ScriptTurn("Is a visa needed in Norway?", model_fault=ModelFault(free_text="Search")),
        ScriptTurn("Is a nut-free meal available on this route?"),
        ScriptTurn(
            "We are 2 passengers. Which flights leave in the morning on the outbound leg?",
            "search",
            ("passengers",),
            fault("search_flights", "http_400"),
        ),
        ScriptTurn("Thanks. Can Sam and I sit together?"),
        ScriptTurn("Does the fare include seat selection?"),
        ScriptTurn("Is there wifi on board?", model_fault=ModelFault(truncate="continued")),
        ScriptTurn("Can I bring my own snacks through security?"),
        ScriptTurn(
            "Please look up the flights on the outbound leg once more.",
            "search",
            model_fault=ModelFault(free_text="検索する"),
        ),
        ScriptTurn("What is the cancellation policy for this fare?"),
        ScriptTurn("Can we add travel insurance later?"),
        ScriptTurn(
            "Are there any later flights on the outbound leg?", "search", (), fault("search_flights", "timeout")
        ),
        ScriptTurn("Is there a lounge we could use in Lisbon?"),
        ScriptTurn("What about priority boarding, is that worth it?"),
        ScriptTurn("Can you sum up the trip for me?", model_fault=ModelFault(truncate="cut_again")),
        ScriptTurn(COMPLAINT),
        ScriptTurn("Do children need their own passport in Norway? A friend asked me."),
        ScriptTurn(
            "What is the weather usually like in Oslo in spring?",
            model_fault=ModelFault(free_text="search for more information"),
        ),
        ScriptTurn("Which terminal does the flight leave from?"),
        ScriptTurn("Can I change the name on the booking later if needed?"),
        ScriptTurn(
            "Show me the flights on the outbound leg one more time.",
            "search",
            (),
            fault("search_flights", "malformed_payload"),
        ),
        ScriptTurn("How much does an extra checked bag cost?", model_fault=ModelFault(truncate="empty")),
        ScriptTurn("Can I pay with a corporate card?"),
        ScriptTurn("Is the airport train running early in the morning?"),
        ScriptTurn("Do you offer carbon offsetting?"),
        ScriptTurn("What is the hand luggage size limit?"),
        ScriptTurn(
            "Let us see the flights for the outbound leg again.", "search", (), fault("search_flights", "http_503", 2)
        ),
        ScriptTurn("Would the aisle and window seats in one row be possible?"),
        ScriptTurn("Do you offer a discount on bookings made together?"),
        ScriptTurn("Can we bring a folding bicycle?"),
        ScriptTurn("What happens if the flight is delayed by more than three hours?"),
        ScriptTurn("Does the return flight have a meal service?"),
        ScriptTurn("How do I add my frequent flyer number to the booking?"),
        ScriptTurn("Is online check-in available for this route?"),
        ScriptTurn("Could you remind me what we have so far?", model_fault=ModelFault(truncate="repeats")),
        ScriptTurn("Alright, I think I have everything I need."),
        ScriptTurn("Yes, please book it.", expect="book"),
        ScriptTurn("Thank you! Will I get the confirmation by email?"),
        ScriptTurn("Which flights did you book us on?", expect="search"),
        ScriptTurn("Can I choose the seats now?"),
        ScriptTurn("Is the special meal noted on the booking?"),
        ScriptTurn("What should we pack for the weather up there?"),
        ScriptTurn("Can you tell me the booking reference again?"),
        ScriptTurn("How do we get from the airport into the city centre?"),
        ScriptTurn("Is there luggage storage at the station?"),
        ScriptTurn("Do we need cash in Norway?"),
        ScriptTurn("What time should we leave home for the airport?"),
        ScriptTurn("Can I upgrade the return flight with points?"),
        ScriptTurn("Is there anything else I should know before the trip?"),
        ScriptTurn("Great, that is all."),
        ScriptTurn("Thanks again, goodbye!"),
    ]


def script_problems(script: list[ScriptTurn], *, today: date) -> list[str]:
    """Messages the demo model's keyword parsers would misread (both models share them), so the comparison
    stays about the architecture: a stray "from nine to six" is read as a new route by either model, and in
    CONFIRMING the demo reads "ticket", "when", "day"… as a request to change that detail."""
    from examples.booking.demo import _CHANGE_TARGETS, _START_OVER
    from examples.booking.slot_parsing import extract_slots

    problems: list[str] = []
    given: set[str] = set()
    for seq, turn in enumerate(script, start=1):
        found = set(extract_slots(turn.text, asking=("passengers",), today=today))
        if found != set(turn.gives):
            problems.append(f"turn {seq}: the parsers read {sorted(found)}, the script says {sorted(turn.gives)}")
        given.update(turn.gives)
        if _START_OVER.search(turn.text):
            problems.append(f"turn {seq}: reads as 'start over'")
        if all(slot in given for slot in REQUIRED_SLOTS) and not turn.gives and turn.expect != "book":
            hits = [target for pattern, target in _CHANGE_TARGETS if pattern.search(turn.text)]
            if hits:
                problems.append(f"turn {seq}: reads as a change request ({', '.join(hits)})")
    return problems


# --- one agent's run ------------------------------------------------------------------------------------
@dataclass
class TurnRecord:
    seq: int
    reply: str | None  # None: crashed (exception or no reply)
    branch: str
    prompt_tokens: int
    failed: bool = False  # the turn ended in an error the user was told about (the app's clean failure)
    cut_reply_shown: bool = False  # a reply cut off by the token limit was shown as if whole
    cut_outcome: str = ""  # on a turn whose reply was cut off: what the user got (``CUT_OUTCOMES``)
    error: str = ""


# What a user got on a turn whose reply the model cut off.
CUT_OUTCOMES = {
    "whole": "the whole reply (continued)",
    "marked": "the reply so far, marked cut off",
    "shown as whole": "the cut-off reply, shown as whole",
    "failed": "an error message",
    "crash": "nothing (crash)",
}


@dataclass
class AgentRun:
    name: str
    turns: list[TurnRecord] = field(default_factory=list)
    final_prompt: str = ""  # what the model read at the last turn ("" when it refused the prompt)
    final_data: dict[str, Any] = field(default_factory=dict)  # the collected (structured) data at the last turn
    store: list[str] = field(default_factory=list)  # what its memory store holds at the end (retrievable later)
    seconds: float = 0.0


def measure(run: AgentRun, script: list[ScriptTurn]) -> dict[str, Any]:
    """The gallery's figures for one run (see the module docstring)."""
    given: set[str] = set()
    repeated: list[dict[str, Any]] = []
    misroutes: list[dict[str, Any]] = []
    other_wrong: list[dict[str, Any]] = []
    for record, turn in zip(run.turns, script, strict=False):
        if record.reply:
            again = [slot for slot in asked_slots(record.reply) if slot in given]
            if again:
                repeated.append({"turn": record.seq, "slots": again})
            if record.branch and record.branch != turn.expect:
                wrong = {
                    "turn": record.seq,
                    "expected": turn.expect,
                    "took": record.branch,
                    "fault": turn.fault_label(),
                }
                # A mis-route is free-text routing choosing the branch; other wrong branches are listed apart.
                (misroutes if turn.model_fault.free_text else other_wrong).append(wrong)
        given.update(turn.gives)
    data_text = json.dumps(run.final_data, sort_keys=True)
    where = {
        name: {
            "in_prompt": any(m in run.final_prompt for m in markers),
            "in_collected_data": any(m in data_text for m in markers),
            "in_store": any(m in text for m in markers for text in run.store),
        }
        for name, markers in FACTS.items()
    }
    lost = [name for name, w in where.items() if not (w["in_prompt"] or w["in_collected_data"])]
    crashes = [r for r in run.turns if r.reply is None]
    tokens = {str(n): run.turns[n - 1].prompt_tokens for n in CHECKPOINTS if n <= len(run.turns)}
    return {
        "crashes": len(crashes),
        "crashed_turns": [r.seq for r in crashes],
        "crash_errors": sorted({r.error.split(":", 1)[0] for r in crashes if r.error}),
        "failed_turns_explained": [r.seq for r in run.turns if r.failed and r.reply],
        "prompt_tokens": tokens,
        "max_prompt_tokens": max((r.prompt_tokens for r in run.turns), default=0),
        "repeated_questions": len(repeated),
        "repeated_detail": repeated,
        "misroutes": len(misroutes),
        "misroute_detail": misroutes,
        "other_wrong_branches": other_wrong,
        "cut_replies_shown": sum(1 for r in run.turns if r.cut_reply_shown),
        "cut_replies_marked": sum(1 for r in run.turns if r.cut_outcome == "marked"),
        "cut_off_detail": [
            {"turn": r.seq, "continuation": t.model_fault.truncate, "outcome": r.cut_outcome}
            for r, t in zip(run.turns, script, strict=False)
            if t.model_fault.truncate
        ],
        "lost_data": lost,
        "facts_at_last_turn": where,
        "prompt_growth_per_turn": _growth(run),
        "seconds": round(run.seconds, 1),
    }


def _growth(run: AgentRun) -> float:
    """Prompt growth per turn over the second half of the run (tokens): the least-squares slope through the
    turns that were answered (two end points alone would measure one turn's noise, a summary landing or not)."""
    half = [(r.seq, r.prompt_tokens) for r in run.turns[len(run.turns) // 2 :] if r.prompt_tokens]
    if len(half) < 2:
        return 0.0
    mean_x = sum(x for x, _ in half) / len(half)
    mean_y = sum(y for _, y in half) / len(half)
    spread = sum((x - mean_x) ** 2 for x, _ in half)
    return round(sum((x - mean_x) * (y - mean_y) for x, y in half) / spread, 1)


@contextmanager
def _tool_faults(turn: ScriptTurn) -> Iterator[None]:
    from agents.tools.faults import inject_fault

    with ExitStack() as stack:
        for f in turn.tool_faults:
            stack.enter_context(inject_fault(f.tool, f.kind, times=f.times))
        yield


# --- the app's model: the demo model (or a real one) with the gallery's shared behaviour and faults --------
def _faulted(base: type) -> type:
    """``base`` (a provider class) with the gallery's faults: free-text routing, and reply calls cut off by the
    token limit, whose continuations are answered as the turn's ``ModelFault.truncate`` says (``CUT_CASES``)."""
    from llm.base import LLMClientError
    from llm.continuation import continued_partial
    from llm.demo import word_chunks
    from llm.provider_base import OpenedStream, RawCompletion, streams_reply
    from llm.tokens import counter_for

    class GalleryModel(base):
        window: int | None = None  # a window it enforces itself (a real server enforces its own)
        knows_rest = False  # whether its continuations give exactly the rest of the reply it cut off

        def _gallery_init(self, *, window: int | None) -> None:
            self.window = window
            self.fault = ModelFault()
            self.tokens = counter_for(self.model)
            self.reads: list[tuple[list[dict[str, Any]], int]] = []  # this turn's reply prompts and their tokens
            self.cut_texts: list[str] = []  # this turn's replies cut off by the (injected) token limit
            self.whole_texts: list[str] = []  # and the whole replies they were cut from

        def turn_begins(self, fault: ModelFault) -> None:
            self.fault, self.reads, self.cut_texts, self.whole_texts = fault, [], [], []

        def _request(
            self,
            messages: list[dict[str, Any]],
            *,
            temperature: float | None,
            max_tokens: int | None,
            tools: list[Any] | None,
            schema: Any,
            purpose: str,
        ) -> RawCompletion:
            tokens = self.tokens.count_messages(messages) + self.tokens.count_tools(
                [t.as_openai() for t in tools or []]
            )
            if self.window and tokens > self.window:
                raise LLMClientError(f"context_length_exceeded: {tokens} tokens > {self.window}")
            # Free text where a decision was asked for: its own call's, or inside the reply's (``purpose`` "reply").
            if schema is not None and purpose in ("slots", "route", "reply") and self.fault.free_text:
                return RawCompletion(text=self.fault.free_text, finish_reason="stop", model=self.model)
            if schema is not None and purpose == "reply" and streams_reply(schema):
                # A workflow's decision and reply in one call (issue 54): its prompt is the turn's reply prompt.
                self.reads.append((messages, tokens))
                if self.knows_rest:  # the demo's script (a real model answers the one call itself)
                    return self._decided(messages, schema=schema, temperature=temperature)
            if schema is not None or purpose != "reply":
                return super()._request(
                    messages,
                    temperature=temperature,
                    max_tokens=max_tokens,
                    tools=tools,
                    schema=schema,
                    purpose=purpose,
                )
            self.reads.append((messages, tokens))
            case = self.fault.truncate
            partial = continued_partial(messages)
            if partial is None or not case or not self.cut_texts:
                raw = self._reply(messages, temperature=temperature, max_tokens=max_tokens, tools=tools)
                if case and partial is None and raw.text and not raw.tool_calls:
                    self.whole_texts.append(raw.text)
                    self.cut_texts.append(cut_in_half(raw.text, self.tokens))
                    return RawCompletion(text=self.cut_texts[-1], finish_reason="length", model=self.model)
                return raw
            # Asked to continue the reply it cut off: what a real endpoint may answer.
            if case == "empty":
                return RawCompletion(text="", finish_reason="stop", model=self.model)
            if case == "repeats":
                return RawCompletion(text=partial, finish_reason="stop", model=self.model)
            rest = self._continuation(messages, partial, temperature=temperature, max_tokens=max_tokens, tools=tools)
            if case == "cut_again" and rest:
                return RawCompletion(text=cut_in_half(rest, self.tokens), finish_reason="length", model=self.model)
            return RawCompletion(text=rest, finish_reason="stop", model=self.model)

        def _open_stream(
            self,
            messages: list[dict[str, Any]],
            *,
            temperature: float | None,
            max_tokens: int | None,
            tools: list[Any] | None,
            purpose: str,
            schema: Any = None,
        ) -> OpenedStream:
            # Through ``_request`` (the faults apply there), streamed in word-sized deltas; a streamed structured
            # reply (the decision inside the reply's call) as its JSON.
            raw = self._request(
                messages, temperature=temperature, max_tokens=max_tokens, tools=tools, schema=schema, purpose=purpose
            )
            return OpenedStream(chunks=word_chunks(raw))

        def _reply(
            self, messages: list[dict[str, Any]], *, temperature: float | None, max_tokens: int | None, tools: Any
        ) -> RawCompletion:
            return super()._request(
                messages, temperature=temperature, max_tokens=max_tokens, tools=tools, schema=None, purpose="reply"
            )

        def _decided(self, messages: list[dict[str, Any]], *, schema: Any, temperature: float | None) -> RawCompletion:
            """A workflow's decision and its reply in one call (issue 54): the decision the model gives, then the
            reply this gallery's model gives to the prompt that follows it (a flight search is asked for as
            ``needs_tool``); the turn's cut-off fault cuts the reply's text, as it cuts a reply of its own."""
            from agents.tools import tool_specs
            from llm.demo.registry import reply_prompt_after

            whole = super()._request(
                messages, temperature=temperature, max_tokens=None, tools=None, schema=schema, purpose="reply"
            )
            decided = schema.model_validate_json(whole.text)
            prompt = reply_prompt_after(schema, messages, decided) or messages
            system = str(messages[0].get("content") or "") if messages else ""
            offered = (
                tool_specs(["search_flights"]) if "Tools you may need to answer: search_flights" in system else None
            )
            answer = self._reply(prompt, temperature=temperature, max_tokens=None, tools=offered)
            fields = decided.model_dump(mode="json")
            if answer.tool_calls:
                return RawCompletion(
                    text=json.dumps({**fields, "needs_tool": True, "reply": ""}), finish_reason="stop", model=self.model
                )
            fields["reply"] = answer.text
            if not self.fault.truncate or not answer.text:
                return RawCompletion(text=json.dumps(fields), finish_reason="stop", model=self.model)
            # Cut off by the token limit inside the reply: the object ends in the middle of its text.
            self.whole_texts.append(answer.text)
            self.cut_texts.append(cut_in_half(answer.text, self.tokens))
            cut = json.dumps({**fields, "reply": self.cut_texts[-1]})
            return RawCompletion(text=cut[: -len('"}')], finish_reason="length", model=self.model)

        def _continuation(
            self,
            messages: list[dict[str, Any]],
            partial: str,
            *,
            temperature: float | None,
            max_tokens: int | None,
            tools: Any,
        ) -> str:
            # The model's own answer to the request to continue.
            return self._reply(messages, temperature=temperature, max_tokens=max_tokens, tools=tools).text

    return GalleryModel


def gallery_demo_model(*, window: int = WINDOW) -> Any:
    """The offline demo model, plus what the gallery needs of a model (same rules as ``NaiveModel``)."""
    from examples.booking.demo import read_prompt_state
    from llm.base import ToolCallRequest
    from llm.demo import DemoModel
    from llm.provider_base import RawCompletion

    class GalleryDemoModel(_faulted(DemoModel)):  # type: ignore[misc]
        """``DemoModel`` + a window it enforces, flight searches on request, and the turn's injected faults."""

        knows_rest = True

        def __init__(self) -> None:
            super().__init__()
            self._gallery_init(window=window)

        def _reply(
            self, messages: list[dict[str, Any]], *, temperature: float | None, max_tokens: int | None, tools: Any
        ) -> RawCompletion:
            system = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
            user = next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user"), "")
            after_user = messages[max(i for i, m in enumerate(messages) if m.get("role") == "user") + 1 :]
            searched = [
                m
                for m in after_user
                if m.get("role") == "assistant"
                and any(c["function"]["name"] == "search_flights" for c in m.get("tool_calls") or [])
            ]
            results = [m for m in after_user if m.get("role") == "tool"]
            if searched and results:
                return RawCompletion(
                    text=search_reply(str(results[-1].get("content") or "")), finish_reason="stop", model=self.model
                )
            found = read_prompt_state(system)
            names = {t.name for t in tools or []}
            arguments = search_arguments(found[1]) if found else None
            if not after_user and asks_for_flights(user) and "search_flights" in names and arguments:
                call = ToolCallRequest(
                    id=f"call_search_{len(self.reads)}", name="search_flights", arguments=json.dumps(arguments)
                )
                return RawCompletion(text="", finish_reason="tool_calls", model=self.model, tool_calls=[call])
            return DemoModel._request(
                self,
                messages,
                temperature=temperature,
                max_tokens=max_tokens,
                tools=tools,
                schema=None,
                purpose="reply",
            )

        def _continuation(
            self,
            messages: list[dict[str, Any]],
            partial: str,
            *,
            temperature: float | None,
            max_tokens: int | None,
            tools: Any,
        ) -> str:
            # The demo's words are deterministic: the rest of the reply it cut off is known.
            whole = self.whole_texts[-1]
            return whole[len(partial) :] if whole.startswith(partial) else ""

    return GalleryDemoModel()


def gallery_real_model(profile: Any) -> Any:
    """A real OpenAI-compatible endpoint (``profile``) with the gallery's faults: its replies are its own, cut
    where the script says; asked to continue, it answers itself (``continued``, and ``cut_again`` cut once
    more), or the injected empty or repeated answer."""
    from llm.openai_compat import OpenAICompatibleProvider

    class GalleryRealModel(_faulted(OpenAICompatibleProvider)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(profile=profile)
            self._gallery_init(window=None)

    return GalleryRealModel()


def _cut_outcome(
    reply: str, *, failed: bool, truncated: bool, cuts: list[str], wholes: list[str], cut_last: bool
) -> str:
    """What the user got on a turn whose reply was cut off (``CUT_OUTCOMES``), judged apart from the app's own
    rules: unmarked, the reply must hold the whole text (when known) or go on past the cut with new words."""
    if failed:
        return "failed"
    if truncated:
        return "marked"
    if wholes and wholes[-1] in reply:
        return "whole"
    if cut_last or not cuts:  # the last reply call was cut, or (a real model's own limit) it was not
        return "shown as whole" if cut_last else "whole"
    cut = max(cuts, key=len).strip()
    rest = reply.strip()[len(cut) :] if reply.strip().startswith(cut) else reply
    added = rest.strip()
    return "whole" if added and added not in cut and not wholes else "shown as whole"


def run_app(script: list[ScriptTurn], *, user: Any, model: Any = None, max_tokens: int | None = None) -> AgentRun:
    """The app: ``turn_run`` with the flight-booking agent, one session, on ``GalleryDemoModel`` (or ``model``,
    from ``gallery_real_model``)."""
    from agents.models import Agent, LLMCall, ToolInvocation
    from agents.services import default_agents_ensure
    from llm.providers import provider_override
    from memory.models import Memory
    from orchestrator.runtime import turn_run
    from sessions.models import ChatSession, Turn
    from sessions.services import session_create

    default_agents_ensure()
    agent = Agent.objects.get(slug="flight-booking")
    if max_tokens is not None:
        agent.max_tokens = max_tokens
        agent.save(update_fields=["max_tokens"])
    model = model or gallery_demo_model(window=agent.context_window)
    session = session_create(user=user, agent=agent, title="failure gallery")
    run = AgentRun(name="this app")
    started = time.monotonic()
    with provider_override(model):
        for seq, turn in enumerate(script, start=1):
            model.turn_begins(turn.model_fault)
            record = TurnRecord(seq=seq, reply=None, branch="", prompt_tokens=0)
            try:
                with _tool_faults(turn):
                    result = turn_run(session=session, message=turn.text)
                saved = Turn.objects.get(pk=result.turn.pk)
                record.reply = saved.assistant_message or None
                record.failed = saved.status == Turn.Status.FAILED
                record.error = saved.error
                tools_run = set(ToolInvocation.objects.filter(turn=saved).values_list("name", flat=True))
                record.branch = (
                    "book" if "book_flight" in tools_run else "search" if "search_flights" in tools_run else "answer"
                )
                calls = list(
                    LLMCall.objects.filter(turn=saved, purpose="reply").order_by("pk").values_list("outcome", flat=True)
                )
                if model.cut_texts or "truncated" in calls:
                    record.cut_outcome = _cut_outcome(
                        saved.assistant_message,
                        failed=record.failed,
                        truncated=saved.truncated,
                        cuts=model.cut_texts,
                        wholes=model.whole_texts if model.knows_rest else [],
                        cut_last=bool(calls) and calls[-1] == "truncated",
                    )
                    record.cut_reply_shown = record.cut_outcome == "shown as whole"
            except Exception as exc:  # noqa: BLE001 - an exception reaching the caller is a crash, whatever it is
                record.error = f"{type(exc).__name__}: {exc}"
                if turn.model_fault.truncate:
                    record.cut_outcome = "crash"
            record.prompt_tokens = max((tokens for _, tokens in model.reads), default=0)
            run.turns.append(record)
        session = ChatSession.objects.get(pk=session.pk)
    last_read = model.reads[-1][0] if model.reads else []
    run.final_prompt = "\n".join(str(m.get("content") or "") for m in last_read)
    run.final_data = dict(session.data)
    run.store = [str(t) for t in Memory.objects.filter(user=user).values_list("text", flat=True)]
    run.seconds = time.monotonic() - started
    return run


def run_naive(script: list[ScriptTurn], *, user: Any, today: date) -> AgentRun:
    """The seed's naive agent on ``NaiveModel``, with the app's tool bodies called the naive way."""
    from django.conf import settings

    from agents.tools.faults import apply_fault
    from agents.tools.registry import ToolContext, ToolOutput, default_registry
    from examples.booking.tools import BookFlightArgs, SearchFlightsArgs
    from llm.demo import DEMO_MODEL_NAME
    from llm.tokens import counter_for
    from memory.embedding import get_embedder

    registry = default_registry()
    search_tool, book_tool = registry.get("search_flights"), registry.get("book_flight")
    assert search_tool is not None and book_tool is not None
    context = ToolContext(user=user)

    def raw(tool: Any, args: Any) -> str:
        # No deadline, no retry, no try/except: the upstream failure (injected) propagates.
        apply_fault(tool.name, timeout_s=float(settings.TOOLS_DEFAULT_TIMEOUT))
        value = tool.run(args, context)
        return value.text if isinstance(value, ToolOutput) else str(value)

    def search(slots: dict[str, Any]) -> str:
        return raw(search_tool, SearchFlightsArgs.model_validate(search_arguments(slots) or {}))

    def book(slots: dict[str, Any]) -> str:
        fields = {k: slots.get(k) for k in (*REQUIRED_SLOTS, "return_date") if slots.get(k)}
        return raw(book_tool, BookFlightArgs.model_validate(fields))

    model = NaiveModel(counter=counter_for(DEMO_MODEL_NAME), today=today, window=WINDOW)
    agent = NaiveAgent(model=model, tools={"search_flights": search, "book_flight": book}, embed=get_embedder().embed)
    run = AgentRun(name="naive (seeds)")
    started = time.monotonic()
    last = None
    for seq, turn in enumerate(script, start=1):
        model.fault = turn.model_fault
        with _tool_faults(turn):
            last = agent.run_turn(turn.text)
        run.turns.append(
            TurnRecord(
                seq=seq,
                reply=last.reply or None,
                branch=last.branch if last.reply else "",
                prompt_tokens=last.prompt_tokens,
                cut_reply_shown=bool(last.reply) and last.finish_reason == "length",
                cut_outcome=(("shown as whole" if last.reply else "crash") if turn.model_fault.truncate else ""),
                error=last.error,
            )
        )
    if last is not None and last.accepted:
        run.final_prompt = last.prompt
    run.store = [text for text, _ in agent.memories]
    run.seconds = time.monotonic() - started
    return run


# --- the benchmark --------------------------------------------------------------------------------------
@contextmanager
def gallery_settings(*, tool_timeout: float = 1.0) -> Iterator[None]:
    """The run's settings: a short tool deadline (the timeout fault then costs seconds, not minutes), the
    deterministic embedder, and background tasks run inline, as a worker that keeps up would run them."""
    from django.test import override_settings

    from config.celery import app

    eager = app.conf.task_always_eager
    app.conf.task_always_eager = True
    # Each turn logs its tasks and tool retries; the table is the output. Errors still show.
    logging.disable(logging.WARNING)
    try:
        with override_settings(TOOLS_DEFAULT_TIMEOUT=tool_timeout, EMBEDDING_BACKEND="hashing", TOOLS_FAULTS=""):
            yield
    finally:
        logging.disable(logging.NOTSET)
        app.conf.task_always_eager = eager


def gallery(*, user: Any, turns: int = 60, today: date | None = None) -> dict[str, Any]:
    """Run both agents through the first ``turns`` turns of the script; the figures of each (needs the database)."""
    today = today or date.today()
    script = conversation(today)[:turns]
    with gallery_settings():
        naive = run_naive(script, user=user, today=today)
        app = run_app(script, user=user)
    faults = {str(i): t.fault_label() for i, t in enumerate(script, start=1) if t.fault_label()}
    return {
        "turns": len(script),
        "window": WINDOW,
        "faults": faults,
        "agents": {"naive": measure(naive, script), "app": measure(app, script)},
        "replies": {
            "naive": [r.reply if r.reply is not None else f"(crash: {r.error})" for r in naive.turns],
            "app": [r.reply if r.reply is not None else f"(crash: {r.error})" for r in app.turns],
        },
    }


def real_model_gallery(*, user: Any, profile: Any, turns: int = 60, max_tokens: int | None = None) -> dict[str, Any]:
    """The app alone through the script on a real OpenAI-compatible endpoint (``profile``), the same faults
    injected (``gallery_real_model``); the naive agent's figures do not depend on the model, so it is not run.
    ``max_tokens``: the booking agent's reply budget (a small model's window leaves little room)."""
    today = date.today()
    script = conversation(today)[:turns]
    with gallery_settings():
        app = run_app(script, user=user, model=gallery_real_model(profile), max_tokens=max_tokens)
    return {
        "turns": len(script),
        "model": profile.model,
        "base_url": profile.base_url,
        "max_tokens": max_tokens,
        "faults": {str(i): t.fault_label() for i, t in enumerate(script, start=1) if t.fault_label()},
        "agents": {"app": measure(app, script)},
        "replies": {"app": [r.reply if r.reply is not None else f"(crash: {r.error})" for r in app.turns]},
    }


def table_rows(result: dict[str, Any], real: dict[str, Any] | None = None) -> tuple[list[str], list[list[str]]]:
    """The gallery's table: its header and rows, one column per agent (and the app on a real model, from
    ``real_model_gallery``'s result, when given)."""
    columns = [("naive agent (seeds)", result["agents"]["naive"]), ("this app (demo model)", result["agents"]["app"])]
    if real is not None:
        columns.append((f"this app ({real['model']}, real)", real["agents"]["app"]))
    measures = [m for _, m in columns]

    def turns(numbers: list[int]) -> str:
        return f" (turn{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))})" if numbers else ""

    def row(label: str, cell: Any) -> list[str]:
        return [label, *(cell(m) for m in measures)]

    rows = [
        row(
            "crashes (exception reached the caller / no reply)", lambda m: f"{m['crashes']}{turns(m['crashed_turns'])}"
        ),
        row(
            "failed turns, explained to the user",
            lambda m: f"{len(m['failed_turns_explained'])}{turns(m['failed_turns_explained'])}",
        ),
        row(
            f"prompt tokens at turn {' / '.join(str(n) for n in CHECKPOINTS)}",
            lambda m: " / ".join(f"{m['prompt_tokens'].get(str(n), 0):,}" for n in CHECKPOINTS),
        ),
        row("prompt growth per turn, second half", lambda m: f"{m['prompt_growth_per_turn']:+g}"),
        row(
            "repeated questions (asks for a slot already given)",
            lambda m: f"{m['repeated_questions']}{turns([d['turn'] for d in m['repeated_detail']])}",
        ),
        row(
            "mis-routes (free-text routing)",
            lambda m: f"{m['misroutes']}{turns([d['turn'] for d in m['misroute_detail']])}",
        ),
        row(
            "other wrong branches",
            lambda m: f"{len(m['other_wrong_branches'])}{turns([d['turn'] for d in m['other_wrong_branches']])}",
        ),
        row(
            "cut-off replies shown as whole",
            lambda m: (
                f"{m['cut_replies_shown']}"
                + turns([d["turn"] for d in m["cut_off_detail"] if d["outcome"] == "shown as whole"])
            ),
        ),
        row("cut-off replies kept, marked cut off", lambda m: str(m["cut_replies_marked"])),
    ]
    for case in result["agents"]["app"]["cut_off_detail"]:
        if case["continuation"]:
            n = case["turn"]
            rows.append(
                row(
                    f"turn {n}, cut off; asked to continue, the model gives {CUT_CASES[case['continuation']]}",
                    lambda m, n=n: next((d["outcome"] for d in m["cut_off_detail"] if d["turn"] == n), "-") or "-",
                )
            )
    rows.append(
        row(
            f"early facts lost at turn {result['turns']} (of {len(FACTS)})",
            lambda m: f"{len(m['lost_data'])}" + (f": {', '.join(m['lost_data'])}" if m["lost_data"] else ""),
        )
    )
    return ["measure", *(name for name, _ in columns)], rows


def markdown_table(result: dict[str, Any], real: dict[str, Any] | None = None) -> str:
    header, rows = table_rows(result, real)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _table(result: dict[str, Any], real: dict[str, Any] | None = None) -> Any:
    from rich.table import Table

    header, rows = table_rows(result, real)
    table = Table(title=f"Failure gallery: {result['turns']} turns, same messages, faults and model behaviour")
    table.add_column(header[0])
    for name in header[1:]:
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(*r)
    return table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gallery")
    parser.add_argument("--turns", type=int, default=60, help="how many turns of the 60-turn script to run")
    parser.add_argument("--output", type=Path, default=RESULTS / "gallery.json")
    parser.add_argument(
        "--real-model",
        type=Path,
        default=None,
        help="a real-model run's result (tests/real_model/test_real_gallery.py with GALLERY_REAL_OUTPUT): its column too",
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/reliability.md)")
    args, _ = parser.parse_known_args(argv)  # options after "--" are shared by every part

    from django.contrib.auth import get_user_model
    from django.test.utils import setup_databases
    from rich.console import Console

    # A throwaway database (kept between runs): sessions, bookings and call records stay out of the app's data.
    setup_databases(verbosity=0, interactive=False, keepdb=True, aliases={"default"})  # type: ignore[arg-type]
    user, _ = get_user_model().objects.get_or_create(username=f"gallery-{time.time_ns()}")
    result = gallery(user=user, turns=max(1, min(args.turns, 60)))
    real = json.loads(args.real_model.read_text()) if args.real_model else None
    console = Console()
    console.print(_table(result, real))
    if args.markdown:
        print(markdown_table(result, real))
    for name in ("naive", "app"):
        m = result["agents"][name]
        console.print(
            f"{name}: crashed turns {m['crashed_turns'] or '-'} {m['crash_errors'] or ''}; "
            f"mis-routes {[(d['turn'], d['expected'], d['took']) for d in m['misroute_detail']] or '-'}; "
            f"repeated questions at turns {[d['turn'] for d in m['repeated_detail']] or '-'}; {m['seconds']} s"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    console.print(f"wrote {args.output}")
    app = result["agents"]["app"]
    return 0 if app["crashes"] == 0 and app["misroutes"] == 0 and app["repeated_questions"] == 0 else 1
