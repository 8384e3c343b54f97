"""A long simulated conversation through the context builder, against the seed's append-everything loop.

``simulate`` drives a conversation of N turns on the demo model: each turn has a user message
(some with a tool call and its output), retrieved memories, the workflow step with its collected
data, and the running summary kept up to date by ``sessions.summaries.summarize_session_through``
(optionally ``summary_lag`` turns late, as when the worker is slow). Every prompt is built by
``llm.prompt.build_prompt`` and sent to the model; the naive prompt (everything appended,
as in the seed article's section 2.1) is counted beside it.

``python -m bench context [-- --turns N]`` runs it in a throwaway database, prints the prompt-token
ratios at turns 20, 100 and 500, and writes ``bench/results/context.json`` and ``context.png``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm.base import CallContext, LLMError, TruncatedOutputError
from llm.prompt import ContextBudget, MemoryItem, PromptInputs, TurnText, build_prompt
from llm.tokens import counter_for
from sessions.summaries import summarize_session_through, summary_due

RESULTS = Path(__file__).resolve().parent / "results"

SYSTEM_PROMPT = """You are Skyline, the travel assistant of a small airline. You help customers find and book flights,
change bookings and answer questions about baggage, seats, meals and travel documents.

Be brief and precise. Never invent flight numbers, prices or availability: use the tools. Confirm dates in
ISO format (YYYY-MM-DD) before booking. When a tool fails, say so and offer the next step.

Tone: friendly and professional. Answer in the customer's language. Do not discuss other airlines' internal
policies. If a request is outside your remit (visa decisions, medical advice), say so and point to the right place."""

FIXED_INSTRUCTIONS = "Tool results that start with TOOL_ERROR: are failures: explain them, never pretend they worked."

# Facts stated early; each is looked for in the prompt at the last turn.
SEEDED_FACTS: list[tuple[str, str]] = [
    ("Hi, my name is Dana Whitfield and my frequent flyer number is QX-4471.", "QX-4471"),
    ("I want to fly from Lisbon to Oslo on 2027-03-03 and come back on 2027-03-10.", "Lisbon"),
    ("We will be 2 passengers in total, my partner Sam Ortega is travelling with me.", "Sam Ortega"),
    ("I am allergic to peanuts, so please always request a nut-free meal for me.", "peanuts"),
]
COLLECTED_DATA = {
    "origin": "Lisbon",
    "destination": "Oslo",
    "depart_date": "2027-03-03",
    "return_date": "2027-03-10",
    "passengers": 2,
}
FACT_MARKERS = {"QX-4471": "frequent flyer number", "Lisbon": "origin", "Sam Ortega": "companion", "peanuts": "allergy"}

TOPICS = [
    "baggage allowance",
    "seat selection",
    "meal options",
    "travel insurance",
    "airport transfer",
    "lounge access",
    "check-in times",
    "pet travel",
    "sports equipment",
    "connecting flights",
    "visa documents",
    "loyalty points",
    "hotel recommendations",
    "car rental",
    "weather in Oslo",
]
QUESTIONS = [
    "Can you tell me more about {topic}?",
    "What are the rules for {topic} on this route?",
    "Is {topic} included in the fare, or does it cost extra?",
    "My colleague said something about {topic}, how does it work exactly?",
    "Thanks. One more thing about {topic}: what do most people choose?",
    "ok",
    "Great, that helps.",
    "Could you compare the options for {topic} on the outbound and the return flight?",
]
DETAILS = [
    "I travel a lot for work and usually carry a laptop bag and a small suitcase.",
    "Last time the queue at the airport was very long, so I want to be prepared.",
    "Sam prefers the aisle, I like the window, if that matters.",
    "We might also visit Bergen for a day, but that is not decided yet.",
    "The kids are staying with my parents, so it is just the two of us.",
    "I am not in a hurry, I just want to understand before I pay.",
]
MEMORY_POOL = [
    "Prefers morning departures when they are available.",
    "Usually travels with one cabin bag and one checked bag.",
    "Asked about lounge access on a previous trip to Madrid.",
    "Booked a hotel near the central station last year.",
    "Likes to receive confirmations by email rather than SMS.",
    "Has complained about long transfer times at Frankfurt.",
    "Travelled to Oslo in 2024 for a conference.",
    "Uses the mobile app to check in.",
    "Often asks about carbon offsetting options.",
    "Prefers direct flights even when they cost a little more.",
    "Once missed a connection in Amsterdam and had to rebook.",
    "Pays with a corporate credit card for work trips.",
    "Asked for extra legroom seats on long flights.",
    "Is interested in rail connections from the airport.",
    "Had a delayed bag on a flight to Rome two years ago.",
    "Collects loyalty points and checks the balance often.",
    "Asked about travelling with ski equipment in winter.",
    "Likes a quiet seat away from the galley.",
    "Speaks English and Portuguese.",
    "Has a partner who gets motion sickness on small planes.",
    "Usually books two to three weeks before departure.",
    "Asked whether the airline offers student discounts.",
    "Prefers to avoid overnight layovers.",
    "Has used airport assistance services once.",
    "Wants to know baggage rules before every trip.",
    "Has asked about the refund policy for cancelled flights.",
    "Prefers printed boarding passes for international trips.",
    "Asked about bringing a folding bicycle.",
    "Travels to Scandinavia about twice a year.",
    "Once upgraded to business class with points.",
]
TOOL_SPECS = [
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Find flights between two airports on a date.",
            "parameters": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string"},
                    "destination": {"type": "string"},
                    "date": {"type": "string", "description": "YYYY-MM-DD"},
                },
                "required": ["origin", "destination", "date"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "fare_rules",
            "description": "The rules (baggage, changes, refunds) of a fare class.",
            "parameters": {
                "type": "object",
                "properties": {"fare_class": {"type": "string"}},
                "required": ["fare_class"],
            },
        },
    },
]


@dataclass
class SimTurn:
    seq: int
    prompt_tokens: int
    naive_tokens: int
    sections: dict[str, int]
    degradations: list[str]
    cut_inputs: int
    summary_through_seq: int
    turns_included: int


@dataclass
class SimResult:
    turns: list[SimTurn]
    limit: int
    window: int
    facts: dict[str, str] = field(default_factory=dict)  # marker -> where it was found ("" = missing)
    last_prompt: list[dict[str, Any]] = field(default_factory=list)
    summary: str = ""
    seconds: float = 0.0
    summary_calls: int = 0
    provider: str = ""

    def over_budget(self) -> list[int]:
        return [t.seq for t in self.turns if t.prompt_tokens > self.limit]

    def band(self, *, after: int = 30) -> tuple[float, float, float]:
        """(mean, lowest / mean − 1, highest / mean − 1) of the prompt tokens after turn ``after``."""
        sizes = [t.prompt_tokens for t in self.turns if t.seq > after]
        mean = statistics.fmean(sizes)
        return mean, min(sizes) / mean - 1, max(sizes) / mean - 1

    def ratio_at(self, seq: int) -> float:
        turn = self.turns[seq - 1]
        return turn.naive_tokens / turn.prompt_tokens


def _demo_provider() -> Any:
    from llm.demo import DemoModel
    from llm.providers import get_provider

    provider = get_provider()
    # Reproducible figures: the demo model even when a real endpoint is configured.
    return provider if provider.is_demo else DemoModel()


def _user_message(seq: int, rng: random.Random) -> str:
    if seq <= len(SEEDED_FACTS):
        return SEEDED_FACTS[seq - 1][0]
    topic = TOPICS[rng.randrange(len(TOPICS))]
    text = QUESTIONS[rng.randrange(len(QUESTIONS))].format(topic=topic)
    if rng.random() < 0.5:
        text += " " + DETAILS[rng.randrange(len(DETAILS))]
    return text


def _tool_messages(seq: int, rng: random.Random, dump_rate: float) -> list[dict[str, Any]]:
    """Every fourth turn or so the assistant searched for flights: a tool call and its (long) output."""
    if seq <= len(SEEDED_FACTS) or rng.random() > 0.25:
        return []
    rows = []
    # Mostly a handful of rows; now and then a dump far larger than its budget, which gets cut.
    n_rows = 150 if rng.random() < dump_rate else rng.randint(3, 7)
    for i in range(n_rows):
        hour = 6 + (i * 97 + seq) % 16
        rows.append(
            f"SK{400 + (seq * 7 + i) % 500} LIS-OSL 2027-03-03 dep {hour:02d}:{(seq * 13 + i * 7) % 60:02d} "
            f"arr {(hour + 4) % 24:02d}:{(seq + i * 11) % 60:02d} fare {rng.choice(['LIGHT', 'CLASSIC', 'FLEX'])} "
            f"EUR {180 + (seq * 31 + i * 17) % 400} seats {1 + (seq + i) % 9} stops {i % 2}"
        )
    call_id = f"call_{seq}"
    arguments = json.dumps({"origin": "LIS", "destination": "OSL", "date": "2027-03-03"})
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "search_flights", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "\n".join(rows)},
    ]


def _memories(message: str, rng: random.Random) -> list[MemoryItem]:
    # A stand-in for retrieval: word overlap with the message, then a stable shuffle; best first.
    words = {w.strip(".,?!:").lower() for w in message.split() if len(w) > 3}
    scored = []
    for index, text in enumerate(MEMORY_POOL):
        overlap = len(words & {w.strip(".,").lower() for w in text.split()})
        scored.append((overlap + rng.random() * 0.5, index, text))
    scored.sort(reverse=True)
    # Retrieval returns more than the memory budget holds; the builder keeps the best that fit.
    return [
        MemoryItem(id=index + 1, text=f"{text} {MEMORY_POOL[(index + 11) % len(MEMORY_POOL)]}", score=round(score, 3))
        for score, index, text in scored
    ]


def _workflow_text(seq: int) -> str:
    if seq <= 2:
        return "State: COLLECTING. Ask for what is missing: origin, destination, dates and passengers."
    data = json.dumps(COLLECTED_DATA, sort_keys=True)
    return (
        "State: CONFIRMING. Resume here: summarise the trip below and ask the customer to confirm or change it. "
        f"Do not ask again for data already collected.\nCollected data: {data}"
    )


def simulate(
    *,
    n_turns: int = 500,
    user: Any,
    summary_lag: int = 0,
    seed: int = 7,
    dump_rate: float = 0.0,
    window_turns: int = 24,
    summarizer: Any = None,
) -> SimResult:
    """Run an ``n_turns`` conversation for ``user`` (needs the database); see the module docstring."""
    from agents.models import Agent
    from sessions.models import ChatSession, Turn

    started = time.monotonic()
    rng = random.Random(seed)
    provider = _demo_provider()
    # window_turns is generous so the recent section's token budget, not the turn count, bounds the
    # window: that is what keeps the prompt the same size whatever the length of single turns.
    agent = Agent.objects.create(
        name="Context bench",
        slug=f"context-bench-{seed}-{time.time_ns()}",
        system_prompt=SYSTEM_PROMPT,
        window_turns=window_turns,
    )
    session = ChatSession.objects.create(user=user, agent=agent, workflow="flight_booking", state="CONFIRMING")
    budget = ContextBudget.from_agent(agent)
    counter = counter_for(agent.model or provider.model)
    result = SimResult(turns=[], limit=budget.prompt_limit, window=budget.window, provider=provider.name)
    naive_history = 0  # tokens of every message so far: the seed's loop sends them all again
    naive_system = counter.count_message({"role": "system", "content": SYSTEM_PROMPT + "\n" + "\n".join(MEMORY_POOL)})
    history: list[TurnText] = []
    pending: list[tuple[int, int]] = []  # (run at turn, through seq): summary tasks not finished yet
    requested = 0
    for seq in range(1, n_turns + 1):
        # Summary tasks whose time has come finish before this turn's prompt is built.
        for due_turn, through in [p for p in pending if p[0] <= seq]:
            pending.remove((due_turn, through))
            if summarize_session_through(session_id=session.pk, through_seq=through, provider=summarizer or provider):
                result.summary_calls += 1
        session.refresh_from_db(fields=["summary", "summary_through_seq"])

        message = _user_message(seq, rng)
        tool_messages = _tool_messages(seq, rng, dump_rate)
        memories = _memories(message, rng)
        floor = min(session.summary_through_seq, seq - 1 - budget.window_turns)
        inputs = PromptInputs(
            system_prompt=SYSTEM_PROMPT,
            fixed_instructions=FIXED_INSTRUCTIONS,
            workflow_text=_workflow_text(seq),
            procedural=["Before booking, read the collected data back to the customer and ask for a yes."],
            memories=memories,
            summary=session.summary,
            recent_turns=[t for t in history if t.seq > floor],
            message=message,
            tool_messages=tool_messages,
            tools=TOOL_SPECS,
            summary_through_seq=session.summary_through_seq,
        )
        built = build_prompt(inputs=inputs, budget=budget, counter=counter)
        ctx = CallContext(purpose="reply", agent_id=agent.pk, session_id=session.pk, prompt_sections=built.sections)
        try:
            reply = provider.complete(built.messages, ctx=ctx, max_tokens=budget.reply_tokens).text
        except TruncatedOutputError as exc:
            reply = exc.partial_text
        except LLMError:
            reply = "Sorry, I could not answer that."

        user_msg = {"role": "user", "content": message}
        naive = naive_system + naive_history + counter.count_message(user_msg) + 3
        naive += counter.count_tools(TOOL_SPECS) + sum(counter.count_message(m) for m in tool_messages)
        naive_history += counter.count_message(user_msg) + counter.count_message(
            {"role": "assistant", "content": reply}
        )
        naive_history += sum(counter.count_message(m) for m in tool_messages)  # the naive loop keeps tool output too

        Turn.objects.create(
            session=session,
            seq=seq,
            user_message=message,
            assistant_message=reply,
            status=Turn.Status.COMPLETED,
            composition=built.composition,
            prompt_tokens=built.total_tokens,
            is_demo=provider.is_demo,
        )
        history.append(TurnText(seq=seq, user=message, assistant=reply))
        result.turns.append(
            SimTurn(
                seq=seq,
                prompt_tokens=built.total_tokens,
                naive_tokens=naive,
                sections=dict(built.sections),
                degradations=list(built.degradations),
                cut_inputs=len(built.composition["cut_inputs"]),
                summary_through_seq=session.summary_through_seq,
                turns_included=len(built.composition["turns"]["included"]),
            )
        )
        result.last_prompt = built.messages
        # As the runtime does after a turn: ask for a summary when one is due (summary_request_if_due).
        due = summary_due(
            turns=history[-(budget.window_turns + 3) :],
            budget=budget,
            counter=counter,
            through_seq=session.summary_through_seq,
        )
        if due > requested:
            requested = due
            pending.append((seq + 1 + summary_lag, due))

    session.refresh_from_db(fields=["summary"])
    result.summary = session.summary
    system_text = result.last_prompt[0]["content"]
    summary_part = system_text.split("## Earlier in this conversation (summary)", 1)[-1] if session.summary else ""
    workflow_part = system_text.split("## Current workflow step", 1)[-1].split("\n## ", 1)[0]
    for marker in FACT_MARKERS:
        where = [
            name for name, part in (("summary", summary_part), ("collected data", workflow_part)) if marker in part
        ]
        if not where and any(marker in str(m.get("content", "")) for m in result.last_prompt[1:]):
            where = ["recent turns"]
        result.facts[marker] = " + ".join(where)
    result.seconds = time.monotonic() - started
    return result


# --- the benchmark --------------------------------------------------------------------------------------
def _plot(result: SimResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seqs = [t.seq for t in result.turns]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(seqs, [t.naive_tokens for t in result.turns], label="naive: append everything (seed §2.1)")
    ax.plot(seqs, [t.prompt_tokens for t in result.turns], label="budgeted: window + summary + degradation")
    ax.axhline(result.limit, linestyle="--", color="grey", label=f"prompt limit ({result.limit})")
    ax.axhline(result.window, linestyle=":", color="red", label=f"context window ({result.window})")
    ax.set_yscale("log")
    ax.set_xlabel("turn")
    ax.set_ylabel("prompt tokens (log)")
    ax.set_title(f"Prompt size over a {len(seqs)}-turn conversation ({result.provider} model)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench context")
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--summary-lag", type=int, default=0, help="turns a summary task takes to finish")
    parser.add_argument("--no-plot", action="store_true")
    args, _ = parser.parse_known_args(argv)  # options after "--" are shared by every part

    from django.contrib.auth import get_user_model
    from django.test.utils import setup_databases

    # A throwaway database (kept between runs, like pytest --reuse-db): the bench writes sessions and
    # LLMCall rows that must not land in the app's own data.
    setup_databases(verbosity=0, interactive=False, keepdb=True, aliases={"default"})
    user, _ = get_user_model().objects.get_or_create(username="context-bench")
    result = simulate(n_turns=args.turns, user=user, summary_lag=args.summary_lag)

    checkpoints = [n for n in (20, 100, 500) if n <= args.turns]
    mean, low, high = result.band(after=30) if args.turns > 31 else (0.0, 0.0, 0.0)
    print(f"prompt limit {result.limit} tokens (window {result.window}); provider: {result.provider}")
    print(f"{'turn':>6} {'naive':>10} {'budgeted':>10} {'ratio':>8}")
    for n in checkpoints:
        t = result.turns[n - 1]
        print(f"{n:>6} {t.naive_tokens:>10,} {t.prompt_tokens:>10,} {result.ratio_at(n):>7.1f}x")
    print(
        f"over budget: {len(result.over_budget())} turns; after turn 30: mean {mean:.0f}, band {low:+.1%} .. {high:+.1%}"
    )
    print("early facts at the last turn: " + ", ".join(f"{k} via {v or 'MISSING'}" for k, v in result.facts.items()))
    degraded = sum(1 for t in result.turns if t.degradations)
    print(f"turns degraded: {degraded}; summary calls: {result.summary_calls}; {result.seconds:.1f} s")

    RESULTS.mkdir(exist_ok=True)
    payload = {
        "turns": args.turns,
        "summary_lag": args.summary_lag,
        "provider": result.provider,
        "limit": result.limit,
        "window": result.window,
        "ratios": {str(n): round(result.ratio_at(n), 2) for n in checkpoints},
        "over_budget_turns": result.over_budget(),
        "band_after_30": {"mean": round(mean, 1), "low": round(low, 4), "high": round(high, 4)},
        "facts_at_last_turn": result.facts,
        "turns_degraded": degraded,
        "summary_calls": result.summary_calls,
        "seconds": round(result.seconds, 1),
        # Compact: one list per series, index = turn - 1.
        "curve": {
            "budgeted": [t.prompt_tokens for t in result.turns],
            "naive": [t.naive_tokens for t in result.turns],
            "summary_through_seq": [t.summary_through_seq for t in result.turns],
            "turns_included": [t.turns_included for t in result.turns],
        },
        "sections_at_last_turn": result.turns[-1].sections,
    }
    (RESULTS / "context.json").write_text(json.dumps(payload, indent=1) + "\n")
    if not args.no_plot:
        _plot(result, RESULTS / "context.png")
        print(f"wrote {RESULTS / 'context.json'} and {RESULTS / 'context.png'}")
    return 0 if not result.over_budget() else 1
