"""Long simulated conversations through the context builder (the harness is bench/context_bench.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.context_bench import simulate
from llm.base import LLMConnectionError
from llm.scripted import ScriptedProvider
from llm.tokens import counter_for
from sessions.context import DEFAULT_SHARES, ContextBudget


@pytest.mark.django_db
def test_500_turns_on_the_demo_model_stay_in_budget_and_flat(alice: Any) -> None:
    result = simulate(n_turns=500, user=alice)
    assert len(result.turns) == 500
    assert result.provider == "demo"
    assert result.over_budget() == []
    mean, low, high = result.band(after=30)
    assert -0.10 <= low and high <= 0.10, f"prompt size after turn 30 left the ±10% band: {low:+.1%} .. {high:+.1%}"
    # The naive loop grows without bound; ours does not.
    assert result.turns[-1].naive_tokens > 10 * result.turns[-1].prompt_tokens
    assert result.turns[-1].naive_tokens > result.window  # the seed's loop would have crashed long before
    # The summary keeps up: the window never had to stretch over unsummarized turns for long.
    assert result.turns[-1].summary_through_seq >= 500 - 30
    # The trip facts stated in turns 2-3 are in the last prompt through the collected data.
    assert "collected data" in result.facts["Lisbon"]
    assert "2027-03-03" in result.last_prompt[0]["content"]
    # The user's own early facts, which no collected data holds, survive 500 turns in the summary.
    for fact in ("QX-4471", "Sam Ortega", "peanuts"):
        assert "summary" in result.facts[fact], (fact, result.facts)


@pytest.mark.django_db
def test_with_the_summarizer_down_slow_and_huge_tool_outputs_nothing_overflows(alice: Any) -> None:
    down = ScriptedProvider(default=LLMConnectionError("summarizer endpoint down"))
    result = simulate(n_turns=200, user=alice, summarizer=down, summary_lag=3, dump_rate=0.15, seed=11)
    assert result.over_budget() == []
    assert any(t.cut_inputs for t in result.turns)  # the dumps were cut, visibly
    assert all(r.purpose == "summarize" for r in down.requests) and down.requests
    # The extractive fallback keeps the summary inside its section budget ...
    budget = ContextBudget(
        window=8192, response_reserve=768, safety_margin=0.12, shares=DEFAULT_SHARES, window_turns=24
    )
    assert counter_for("").count(result.summary) <= budget.section_limit("summary")
    # ... and keeps the user's early facts, which no collected data holds.
    assert result.facts["QX-4471"] == "summary"
    assert result.facts["peanuts"] == "summary"
