"""The context builder: budgets, the sliding window, degradation order, visible cuts, the inspector."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.models import Agent
from llm.tokens import counter_for
from sessions.context import (
    DEFAULT_SHARES,
    HEADER_MEMORIES,
    HEADER_PROCEDURES,
    HEADER_SUMMARY,
    HEADER_WORKFLOW,
    SECTIONS,
    ContextBudget,
    ContextOverflowError,
    MemoryItem,
    PromptInputs,
    TurnText,
    build_prompt,
    cut_to_budget,
)
from tests.world import make_agent

COUNTER = counter_for("gpt-4o-mini")
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def words(n: int, seed: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + seed) % len(WORDS)] for i in range(n))


def budget(**overrides: object) -> ContextBudget:
    values: dict[str, object] = {
        "window": 2000,
        "response_reserve": 200,
        "safety_margin": 0.1,
        "shares": dict(DEFAULT_SHARES),
        "window_turns": 5,
        "memory_budget_tokens": 400,
    }
    values.update(overrides)
    return ContextBudget(**values)  # type: ignore[arg-type]


def turns(n: int, size: int = 10) -> list[TurnText]:
    return [
        TurnText(seq=i, user=f"question {i} " + words(size, i), assistant=f"answer {i} " + words(size, i + 1))
        for i in range(1, n + 1)
    ]


def test_prompt_limit_is_window_minus_reserve_minus_margin() -> None:
    b = budget(window=8192, response_reserve=768, safety_margin=0.12)
    assert b.prompt_limit == 8192 - 768 - math.ceil(8192 * 0.12)
    assert b.section_limit("recent") == math.floor(b.prompt_limit * DEFAULT_SHARES["recent"])


def test_memories_section_is_also_held_to_the_memory_budget() -> None:
    assert budget(memory_budget_tokens=50).section_limit("memories") == 50
    big = budget(memory_budget_tokens=100_000)
    assert big.section_limit("memories") == math.floor(big.prompt_limit * DEFAULT_SHARES["memories"])


def test_unknown_section_and_impossible_budget_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown section"):
        budget().section_limit("jokes")
    with pytest.raises(ValueError, match="No room"):
        budget(window=1000, response_reserve=950)


@pytest.mark.django_db  # the endpoint's window is read, and endpoints connected in the admin live in the database
def test_from_agent_reserves_at_least_the_reply_length() -> None:
    agent = Agent(
        name="a",
        slug="a",
        system_prompt="x",
        context_window=4096,
        response_reserve=300,
        max_tokens=900,
        safety_margin=0.15,
        window_turns=7,
        memory_budget_tokens=123,
        section_budgets={"summary": 0.2, "bogus": 3},
    )
    b = ContextBudget.from_agent(agent)
    assert (b.window, b.response_reserve, b.safety_margin, b.window_turns, b.min_turns) == (4096, 900, 0.15, 7, 3)
    assert b.shares["summary"] == 0.2 and "bogus" not in b.shares
    assert b.shares["tools"] == DEFAULT_SHARES["tools"]  # agents without a "tools" share get the default
    assert b.memory_budget_tokens == 123


@pytest.mark.parametrize(
    ("endpoint", "profile_window", "expected"),
    [("", 2048, 2048), ("", 16384, 4096), ("", None, 4096), ("demo", 2048, 4096), ("other", 2048, 4096)],
)
def test_the_endpoints_window_caps_the_agents(
    settings: Any, endpoint: str, profile_window: int | None, expected: int
) -> None:
    """An agent set up with a bigger window than its model's (as configured for the endpoint) cannot overflow
    it; the demo model and an endpoint without a known window leave the agent's own."""
    profile = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "context_window": profile_window}
    settings.LLM_PROFILES = {"default": profile, "other": {**profile, "context_window": None}}
    agent = Agent(name="a", slug="a", system_prompt="x", context_window=4096, endpoint=endpoint)
    assert ContextBudget.from_agent(agent).window == expected


def full_inputs(**overrides: object) -> PromptInputs:
    values: dict[str, object] = {
        "system_prompt": "You are a travel agent.",
        "fixed_instructions": "Tool errors start with TOOL_ERROR: never retry them blindly.",
        "workflow_text": 'Ask for the passenger count. Collected: {"origin": "Lisbon", "date": "2026-03-03"}',
        "procedural": ["Always confirm dates in ISO format."],
        "memories": [
            MemoryItem(id=i, text=f"memory {i}: " + words(8, i), score=1 - i / 10, kind="semantic") for i in range(1, 4)
        ],
        "summary": "- The user is Dana; frequent flyer QX-4471.",
        "recent_turns": turns(3),
        "message": "How many seats are left?",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "search",
                    "description": "Find flights",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
        ],
        "summary_through_seq": 0,
    }
    values.update(overrides)
    return PromptInputs(**values)  # type: ignore[arg-type]


def test_layout_counts_and_inspector() -> None:
    built = build_prompt(inputs=full_inputs(), budget=budget(), counter=COUNTER)
    system = built.messages[0]["content"]
    positions = [system.index(h) for h in (HEADER_WORKFLOW, HEADER_PROCEDURES, HEADER_MEMORIES, HEADER_SUMMARY)]
    assert positions == sorted(positions)
    assert system.startswith("You are a travel agent.") and "TOOL_ERROR" in system
    roles = [m["role"] for m in built.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert built.messages[-1]["content"] == "How many seats are left?"
    # total_tokens is the real count of what is sent, and the sections add up to it.
    assert built.total_tokens == COUNTER.count_messages(built.messages) + COUNTER.count_tools(built.tools)
    assert sum(built.sections.values()) == built.total_tokens
    assert set(built.sections) == set(SECTIONS)
    assert all(built.sections[s] > 0 for s in SECTIONS)
    assert built.total_tokens <= budget().prompt_limit
    comp = built.composition
    assert comp["limit"] == budget().prompt_limit and comp["total"] == built.total_tokens
    assert comp["turns"]["included"] == [1, 2, 3] and comp["turns"]["dropped"] == []
    assert comp["memories"]["included"] == [1, 2, 3]
    assert comp["degradations"] == [] and comp["cut_inputs"] == []
    import json

    json.dumps(comp)  # the runtime stores it in a JSONField


def test_sliding_window_drops_summarized_turns_and_keeps_unsummarized_ones() -> None:
    b = budget(window=8000, window_turns=5)
    built = build_prompt(inputs=full_inputs(recent_turns=turns(15), summary_through_seq=10), budget=b, counter=COUNTER)
    assert built.composition["turns"]["included"] == [11, 12, 13, 14, 15]
    assert built.composition["turns"]["dropped"] == [{"seq": s, "reason": "left the window"} for s in range(1, 11)]
    # The summary only reaches turn 6: turns 7-10 left the window but are kept rather than lost.
    built = build_prompt(inputs=full_inputs(recent_turns=turns(15), summary_through_seq=6), budget=b, counter=COUNTER)
    assert built.composition["turns"]["included"] == list(range(7, 16))
    assert built.composition["turns"]["kept_unsummarized"] == [7, 8, 9, 10]
    assert built.degradations == []


def test_degradations_fire_in_the_fixed_order() -> None:
    b = budget(window=1400, response_reserve=100, safety_margin=0.1, window_turns=10)  # limit 1160
    inputs = full_inputs(
        recent_turns=turns(10, size=95),
        memories=[MemoryItem(id=i, text=words(20, i), score=1 - i / 100) for i in range(1, 8)],
        summary="\n".join(f"- fact {i}: " + words(12, i) for i in range(12)),
        summary_through_seq=0,
    )
    built = build_prompt(inputs=inputs, budget=b, counter=COUNTER)
    assert built.total_tokens <= b.prompt_limit
    # The window shrinks to its minimum before any memory goes; the summary is not touched yet.
    assert built.degradations == ["shrink_window", "drop_memories"]
    comp = built.composition
    assert comp["turns"]["included"] == [8, 9, 10]
    assert [d["seq"] for d in comp["turns"]["dropped"]] == list(range(1, 8))
    assert all(d["reason"].startswith("degraded: window shrunk") for d in comp["turns"]["dropped"])
    dropped = [d["id"] for d in comp["memories"]["dropped"] if d["reason"].startswith("degraded")]
    # Lowest-ranked first: what is left is a prefix of the ranking.
    assert dropped and comp["memories"]["included"] == list(range(1, min(dropped)))
    assert "- fact 11:" in built.messages[0]["content"]


def test_everything_degrades_before_the_error_and_workflow_survives() -> None:
    b = budget(window=1400, response_reserve=100, safety_margin=0.1, window_turns=10)  # limit 1160
    inputs = full_inputs(
        system_prompt="You are a travel agent.\n\n" + words(250),
        procedural=["Always confirm dates."],
        recent_turns=turns(10, size=60),
        memories=[MemoryItem(id=i, text=words(20, i)) for i in range(1, 8)],
        summary="\n".join(f"- fact {i}: " + words(12, i) for i in range(12)),
        workflow_text="Ask for the passenger count. " + words(120),
    )
    built = build_prompt(inputs=inputs, budget=b, counter=COUNTER)
    assert built.degradations == ["shrink_window", "drop_memories", "shorten_summary", "simplify_system"]
    assert built.total_tokens <= b.prompt_limit
    system = built.messages[0]["content"]
    assert "Ask for the passenger count." in system and words(120) in system
    assert HEADER_PROCEDURES not in system and HEADER_MEMORIES not in system
    assert "simplified to fit" in system


def test_overflow_error_names_sections_and_never_returns_an_overlong_prompt() -> None:
    b = budget(window=1000, response_reserve=100, safety_margin=0.1)  # limit 800
    inputs = full_inputs(workflow_text=words(900))
    with pytest.raises(ContextOverflowError) as excinfo:
        build_prompt(inputs=inputs, budget=b, counter=COUNTER)
    err = excinfo.value
    assert err.total > err.limit == 800
    assert "workflow=" in str(err) and "limit is 800" in str(err)
    assert err.sections["workflow"] > 800


def test_a_pasted_document_is_cut_with_a_visible_marker() -> None:
    b = budget()
    document = "BEGIN " + words(3000) + " END"
    built = build_prompt(inputs=full_inputs(message=document), budget=b, counter=COUNTER)
    content = built.messages[-1]["content"]
    limit = b.section_limit("message")
    assert content.startswith("BEGIN") and content.endswith("END")  # head and tail kept
    cut = built.composition["cut_inputs"][0]
    assert cut["input"] == "message" and cut["budget"] == limit
    assert f"{cut['tokens_cut']:,} tokens cut: the input exceeded its {limit:,}-token budget" in content
    assert COUNTER.count(content) <= limit
    assert cut["original_tokens"] == COUNTER.count(document)


def test_a_huge_tool_result_is_cut_and_the_tool_call_kept() -> None:
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "RESULTS " + words(4000)}
    built = build_prompt(inputs=full_inputs(tool_messages=[call, result]), budget=budget(), counter=COUNTER)
    assert built.messages[-2] == call
    assert "tokens cut: the input exceeded its" in built.messages[-1]["content"]
    assert built.composition["cut_inputs"][0]["input"].startswith("tool result")
    assert built.total_tokens <= budget().prompt_limit


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=0, max_size=3000), limit=st.integers(min_value=1, max_value=400))
def test_cut_to_budget_never_exceeds_its_budget(text: str, limit: int) -> None:
    result, cut = cut_to_budget(text, limit, COUNTER)
    assert COUNTER.count(result) <= limit
    assert (cut == 0) == (COUNTER.count(text) <= limit)
    if cut == 0:
        assert result == text


@settings(max_examples=40, deadline=None)
@given(
    n_turns=st.integers(min_value=0, max_value=25),
    turn_size=st.integers(min_value=1, max_value=120),
    n_mem=st.integers(min_value=0, max_value=15),
    summary_words=st.integers(min_value=0, max_value=600),
    message_words=st.integers(min_value=1, max_value=2500),
    workflow_words=st.integers(min_value=0, max_value=400),
    window=st.integers(min_value=900, max_value=4000),
)
def test_the_prompt_never_exceeds_its_limit(
    n_turns: int, turn_size: int, n_mem: int, summary_words: int, message_words: int, workflow_words: int, window: int
) -> None:
    b = budget(window=window, response_reserve=150, window_turns=6)
    inputs = full_inputs(
        recent_turns=turns(n_turns, size=turn_size),
        memories=[MemoryItem(id=i, text=words(15, i)) for i in range(n_mem)],
        summary=words(summary_words),
        message=words(message_words),
        workflow_text=words(workflow_words),
        summary_through_seq=max(0, n_turns - 8),
    )
    try:
        built = build_prompt(inputs=inputs, budget=b, counter=COUNTER)
    except ContextOverflowError as exc:
        assert exc.total > exc.limit
        assert exc.degradations  # it tried before giving up
        return
    assert built.total_tokens == COUNTER.count_messages(built.messages) + COUNTER.count_tools(built.tools)
    assert built.total_tokens <= b.prompt_limit
    assert words(workflow_words) in built.messages[0]["content"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("through", "before", "expected"),
    [
        (0, None, list(range(1, 31))),  # nothing summarized: every completed turn (up to the cap)
        (25, None, list(range(21, 31))),  # summary ahead of the window: the window (seqs 21-30)
        (12, None, list(range(13, 31))),  # summary behind: the window and the unsummarized turns before it
        (0, 20, list(range(1, 20))),  # before a turn: only the turns before it
        (15, 20, list(range(10, 20))),  # the window counts back from the newest turn before it
    ],
)
def test_recent_turns_are_the_window_and_the_unsummarized_turns(
    alice: object, through: int, before: int | None, expected: list[int]
) -> None:
    from sessions.context import recent_turns_for
    from sessions.models import ChatSession, Turn

    agent = make_agent(name="W", slug="w", system_prompt="x", workflow="free_chat", window_turns=10)
    session = ChatSession.objects.create(
        user=alice, agent=agent, workflow="free_chat", state="CHATTING", summary_through_seq=through
    )
    for seq in range(1, 32):
        status = Turn.Status.FAILED if seq == 31 else Turn.Status.COMPLETED  # the newest failed: not history
        Turn.objects.create(
            session=session, seq=seq, user_message=f"u{seq}", assistant_message=f"a{seq}", status=status
        )
    turns = recent_turns_for(session=session, before_seq=before)
    assert [t.seq for t in turns] == expected
    assert (turns[0].user, turns[0].assistant) == (f"u{expected[0]}", f"a{expected[0]}")
    # The cap keeps the newest turns, never fewer than the window.
    assert [t.seq for t in recent_turns_for(session=session, before_seq=before, cap=4)] == expected[-10:]


def test_an_endpoint_window_without_room_for_the_reply_is_a_configuration_error(settings: Any) -> None:
    from llm.base import LLMConfigurationError

    settings.LLM_PROFILES = {"default": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "context_window": 600}}
    agent = Agent(name="a", slug="a", system_prompt="x", context_window=4096, max_tokens=512, response_reserve=768)
    with pytest.raises(LLMConfigurationError, match="leaves no room for a prompt"):
        ContextBudget.from_agent(agent)
