from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import Agent
from observability.selectors import (
    figure_trend,
    indicator_series,
    indicators,
    least_squares_slope,
    metric_totals_by_agent,
    relative_change,
    session_health,
    sessions_at_risk,
    summaries_pending,
)
from sessions.models import ChatSession, Checkpoint
from tests.observability.builders import (
    make_agent,
    make_call,
    make_checkpoint,
    make_session,
    make_tool_run,
    make_turn,
)


def test_least_squares_slope_and_relative_change() -> None:
    assert least_squares_slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2.0)
    assert least_squares_slope([(0, 5), (1, 5), (2, 5)]) == pytest.approx(0.0)
    assert least_squares_slope([(0, 4), (1, 2)]) == pytest.approx(-2.0)
    assert least_squares_slope([(1, 1)]) is None
    assert least_squares_slope([(1, 1), (1, 2)]) is None
    assert relative_change(current=130, previous=100) == pytest.approx(0.3)
    assert relative_change(current=1, previous=0) is None
    assert relative_change(current=None, previous=3) is None


@pytest.mark.django_db
def test_window_figures_overall_and_per_agent(alice: Any) -> None:
    now = timezone.now()
    a, b = make_agent("a"), make_agent("b")
    sa, sb = make_session(user=alice, agent=a), make_session(user=alice, agent=b)
    # Agent a: prompts 100..1000, one in five retried (twice), TTFT 100..1000 ms.
    for i in range(10):
        make_call(
            at=now - dt.timedelta(minutes=i + 1),
            agent=a,
            prompt_tokens=100 * (i + 1),
            retries=2 if i % 5 == 0 else 0,
            ttft_ms=100.0 * (i + 1),
        )
    make_call(at=now - dt.timedelta(minutes=3), agent=b, prompt_tokens=5000, ttft_ms=None)
    make_call(at=now - dt.timedelta(hours=2), agent=a, prompt_tokens=99999)  # outside the window
    make_turn(session=sa, seq=1, at=now - dt.timedelta(minutes=5), step_limit_hit=True, degradations=["summary_cut"])
    make_turn(session=sa, seq=2, at=now - dt.timedelta(minutes=4))
    make_turn(session=sb, seq=1, at=now - dt.timedelta(minutes=4), degradations=[])
    make_checkpoint(session=sa, seq=1, at=now - dt.timedelta(minutes=2), reason="reset")
    make_checkpoint(session=sa, seq=2, at=now - dt.timedelta(minutes=1), reason="failed", state="FAILED")
    make_checkpoint(session=sb, seq=1, at=now - dt.timedelta(minutes=1), reason="transition")
    make_tool_run(session=sa, at=now - dt.timedelta(minutes=2), ok=False)
    make_tool_run(session=sa, at=now - dt.timedelta(minutes=2), ok=True)
    make_tool_run(session=sb, at=now - dt.timedelta(minutes=2), ok=True)

    start = now - dt.timedelta(minutes=30)
    fa = indicators(start=start, end=now, agent_id=a.id)
    assert (fa.calls, fa.calls_retried, fa.retries) == (10, 2, 4)
    assert fa.retry_rate == pytest.approx(0.2) and fa.retries_per_call == pytest.approx(0.4)
    assert fa.prompt_tokens_mean == pytest.approx(550)
    # percentile_cont interpolates: p95 of 100..1000 lies between the two largest.
    assert fa.prompt_tokens_p95 == pytest.approx(955)
    assert fa.ttft_p50_ms == pytest.approx(550) and fa.ttft_samples == 10
    assert (fa.turns, fa.step_limit_hits, fa.degradations) == (2, 1, 1)
    assert (fa.resets, fa.failures) == (1, 1)
    assert fa.tool_error_rate == pytest.approx(0.5)

    overall = indicators(start=start, end=now)
    assert overall.calls == 11 and overall.ttft_samples == 10
    assert overall.turns == 3 and overall.degradations == 1
    assert overall.tool_runs == 3 and overall.tool_errors == 1
    fb = indicators(start=start, end=now, agent_id=b.id)
    assert fb.ttft_p95_ms is None and fb.retry_rate == 0


@pytest.mark.django_db
def test_series_buckets_and_trend(alice: Any) -> None:
    now = timezone.now().replace(microsecond=0)
    agent = make_agent("a")
    start = now - dt.timedelta(hours=1)
    # Six ten-minute buckets; tokens per call rise by 100 a bucket, bucket 3 is empty.
    for bucket in range(6):
        if bucket == 3:
            continue
        for j in range(2):
            make_call(
                at=start + dt.timedelta(minutes=10 * bucket + 1 + j), agent=agent, prompt_tokens=1000 + 100 * bucket
            )
    series = indicator_series(start=start, end=now, bucket=dt.timedelta(minutes=10), agent_id=agent.id)
    assert [p.start for p in series] == [start + dt.timedelta(minutes=10 * i) for i in range(6)]
    assert [p.figures.calls for p in series] == [2, 2, 2, 0, 2, 2]
    assert [p.figures.prompt_tokens_mean for p in series] == [1000, 1100, 1200, None, 1400, 1500]

    trend = figure_trend(attribute="prompt_tokens_mean", now=now, window=dt.timedelta(minutes=30), agent_id=agent.id)
    assert trend.current == pytest.approx(1450) and trend.previous == pytest.approx(1100)
    assert trend.change == pytest.approx(1450 / 1100 - 1)
    assert trend.slope_per_hour == pytest.approx(600, rel=0.01)
    assert trend.rising


@pytest.mark.django_db
def test_summaries_pending(alice: Any) -> None:
    a = make_agent("a")
    behind = make_session(user=alice, agent=a)
    behind.summary_requested_seq, behind.summary_through_seq = 12, 6
    behind.save()
    done = make_session(user=alice, agent=a)
    done.summary_requested_seq = done.summary_through_seq = 6
    done.save()
    assert summaries_pending() == 1
    assert summaries_pending(agent_id=make_agent("b").id) == 0


@pytest.mark.django_db
def test_session_health_signals(alice: Any) -> None:
    now = timezone.now()
    agent = make_agent("a")
    Agent.objects.filter(pk=agent.pk).update(context_window=5000)  # the last prompt, 4,500 tokens, at 90 % of it
    agent.refresh_from_db()
    session = make_session(user=alice, agent=agent)
    for seq in range(1, 10):
        at = now - dt.timedelta(minutes=20 - seq)
        turn = make_turn(session=session, seq=seq, at=at, prompt_tokens=0, state_before="A", state_after="A")
        # Turn.prompt_tokens not set: the health view falls back to the turn's calls.
        make_call(at=at, agent=agent, session=session, turn=turn, prompt_tokens=500 * seq, retries=1 if seq > 6 else 0)
    health = session_health(session=session)
    assert [t.prompt_tokens for t in health.turns] == [500 * s for s in range(1, 10)]
    # Last third (3500, 4000, 4500) against the first third (500, 1000, 1500).
    assert health.tokens_growth == pytest.approx(4000 / 1000 - 1)
    assert health.tokens_slope_per_turn == pytest.approx(500)
    assert health.retries == 3
    assert health.verdict == "spiralling"
    assert any("prompt tokens" in s for s in health.signals)
    assert any("retries" in s for s in health.signals)


@pytest.mark.django_db
def test_prompts_that_grow_with_the_history_far_below_the_window_are_not_a_risk(alice: Any) -> None:
    """Issue 36: a normal 15-turn booking (prompts from 400 to 1,000 tokens, +85 %, of an 8,192-token window) was
    "at risk" on its own page while /ops/ listed nothing. Growth is a signal only when, at its slope, the prompt
    reaches the context window within 20 turns."""
    now = timezone.now()
    agent = make_agent("a")
    session = make_session(user=alice, agent=agent)
    for seq in range(1, 16):
        at = now - dt.timedelta(minutes=20 - seq)
        turn = make_turn(session=session, seq=seq, at=at, prompt_tokens=400 + 43 * (seq - 1))
        make_call(at=at, agent=agent, session=session, turn=turn, prompt_tokens=400 + 43 * (seq - 1))
    health = session_health(session=session)
    assert health.tokens_growth is not None and health.tokens_growth > 0.3
    assert health.signals == [] and health.verdict == "healthy"
    # Issue 55: a 19-turn chat at 4,269 of 6,184 tokens (69 %), growing 100 a turn, was "at risk" too: its budget
    # stops the prompt before the window. Near the window it is a risk: 1,002 of 1,150 tokens (87 %).
    Agent.objects.filter(pk=agent.pk).update(context_window=1500)
    session.refresh_from_db()
    assert session_health(session=session).signals == []
    Agent.objects.filter(pk=agent.pk).update(context_window=1150)
    session.refresh_from_db()
    assert any("heading for the context window" in s for s in session_health(session=session).signals)


@pytest.mark.django_db
def test_sessions_at_risk_scores_each_kind_of_trouble_in_the_window(alice: Any, bob: Any) -> None:
    now = timezone.now()
    start, end = now - dt.timedelta(hours=1), now + dt.timedelta(minutes=1)
    agent = make_agent("risky")
    first, second, calm = (make_session(user=u, agent=agent) for u in (alice, bob, alice))
    # First: a reset (3), two retried calls (1 each), a step-limit hit (2) = 7; an older reset and a call
    # without retries do not count. Many turns and checkpoints besides, as a long session has.
    make_checkpoint(session=first, seq=1, at=now - dt.timedelta(minutes=5), reason=Checkpoint.Reason.RESET)
    make_checkpoint(session=first, seq=2, at=now - dt.timedelta(hours=3), reason=Checkpoint.Reason.RESET)
    for seq in range(3, 40):
        make_checkpoint(session=first, seq=seq, at=now - dt.timedelta(minutes=2), reason="before_call")
    for seq in range(1, 30):
        make_turn(session=first, seq=seq, at=now - dt.timedelta(minutes=3), step_limit_hit=seq == 1)
    for retries in (1, 2, 0):
        make_call(at=now - dt.timedelta(minutes=4), agent=agent, session=first, retries=retries)
    # Second: a FAILED move (3) and two step-limit hits (2 each) = 7, and touched later: first on the tie.
    make_checkpoint(session=second, seq=1, at=now - dt.timedelta(minutes=5), reason=Checkpoint.Reason.FAILED)
    for seq in (1, 2):
        make_turn(session=second, seq=seq, at=now - dt.timedelta(minutes=3), step_limit_hit=True)
    make_call(at=now - dt.timedelta(minutes=4), agent=agent, session=calm, retries=0)
    ChatSession.objects.filter(pk=first.pk).update(updated_at=now - dt.timedelta(minutes=10))
    ChatSession.objects.filter(pk=second.pk).update(updated_at=now - dt.timedelta(minutes=1))

    with CaptureQueriesContext(connection) as ctx:
        risky = sessions_at_risk(start=start, end=end)

    # No statement joins two of the logs: that join reads the product of a session's rows in each.
    joins = ('JOIN "chat_sessions_checkpoint"', 'JOIN "agents_llmcall"', 'JOIN "chat_sessions_turn"')
    assert all(sum(join in q["sql"] for join in joins) <= 1 for q in ctx.captured_queries)

    assert [(r["session"].pk, r["score"]) for r in risky] == [(second.pk, 7), (first.pk, 7)]
    assert {k: risky[1][k] for k in ("resets", "retried_calls", "step_limit_hits")} == {
        "resets": 1,
        "retried_calls": 2,
        "step_limit_hits": 1,
    }
    assert risky[0]["session"].user == bob and risky[0]["session"].agent == agent
    assert sessions_at_risk(start=start, end=end, limit=1)[0]["session"].pk == second.pk
    assert sessions_at_risk(start=now - dt.timedelta(days=2), end=now - dt.timedelta(days=1)) == []


@pytest.mark.django_db
def test_metric_totals_sum_the_old_rows_once_and_only_count_up(alice: Any) -> None:
    now = timezone.now()
    agent = make_agent("sealed")
    old, new = make_session(user=alice, agent=agent), make_session(user=alice, agent=agent)
    for _ in range(3):
        make_call(at=now - dt.timedelta(hours=3), agent=agent, session=old, retries=1, prompt_tokens=300)
    make_turn(session=old, seq=1, at=now - dt.timedelta(hours=3), step_limit_hit=True)
    make_call(at=now - dt.timedelta(minutes=5), agent=agent, session=new, prompt_tokens=5000)
    histograms = {"tokens": ("prompt_tokens", (512.0, 8192.0), 1.0)}

    first = metric_totals_by_agent(histograms=histograms, now=now)["sealed"]
    assert (first["calls"], first["calls_retried"], first["prompt_tokens"]) == (4, 3, 5900)
    assert (first["turns"], first["step_limit_hits"], first["tokens"]) == (1, 1, [3, 4])

    # The rows from before the seal were summed once: the next scrape reads only the newer ones.
    old.delete()  # (and a deleted session takes nothing off: see the next test)
    with CaptureQueriesContext(connection) as ctx:
        again = metric_totals_by_agent(histograms=histograms, now=now)["sealed"]
    assert again == first
    assert all('"created_at" >=' in q["sql"] for q in ctx.captured_queries if '"agents_llmcall"' in q["sql"])

    # Newer rows are read on every scrape; two hours on, the seal passes them and they are counted once.
    make_call(at=now - dt.timedelta(minutes=1), agent=agent, session=new, prompt_tokens=100)
    assert metric_totals_by_agent(histograms=histograms, now=now)["sealed"]["calls"] == 5
    later = metric_totals_by_agent(histograms=histograms, now=now + dt.timedelta(hours=2))["sealed"]
    assert (later["calls"], later["tokens"], later["prompt_tokens"]) == (5, [4, 5], 6000)


@pytest.mark.django_db
def test_a_seal_stored_from_a_clock_ahead_loses_no_rows(alice: Any) -> None:
    now = timezone.now()
    agent = make_agent("skew")
    session = make_session(user=alice, agent=agent)
    make_call(at=now - dt.timedelta(minutes=5), agent=agent, session=session)
    # A process whose clock runs three hours ahead stores its seal; then a call is written, at the true time.
    assert metric_totals_by_agent(now=now + dt.timedelta(hours=3))["skew"]["calls"] == 1
    make_call(at=now, agent=agent, session=session)

    assert metric_totals_by_agent(now=now)["skew"]["calls"] == 2
    assert metric_totals_by_agent(now=now + dt.timedelta(hours=5))["skew"]["calls"] == 2


@pytest.mark.django_db
def test_deleting_a_session_active_this_hour_lowers_no_counter(alice: Any) -> None:
    """Prometheus reads any drop as a restart from zero: rate() then counts the whole value again."""
    now = timezone.now()
    agent = make_agent("deleted")
    kept, gone = make_session(user=alice, agent=agent), make_session(user=alice, agent=agent)
    make_turn(session=kept, seq=1, at=now - dt.timedelta(minutes=30))
    for seq in (1, 2, 3):
        turn = make_turn(session=gone, seq=seq, at=now - dt.timedelta(minutes=10), step_limit_hit=True)
        make_tool_run(session=gone, turn=turn, at=now - dt.timedelta(minutes=10), ok=False)
    make_call(at=now - dt.timedelta(minutes=10), agent=agent, session=gone, prompt_tokens=700)
    histograms = {"tokens": ("prompt_tokens", (512.0, 8192.0), 1.0)}
    before = metric_totals_by_agent(histograms=histograms, now=now)["deleted"]
    assert (before["turns"], before["step_limit_hits"], before["tool_errors"], before["calls"]) == (4, 3, 3, 1)

    gone.delete()  # its turns and tool runs go with it (its model call stays, without a session)
    after = metric_totals_by_agent(histograms=histograms, now=now)["deleted"]
    assert after == before

    # What happens next is counted on top, exactly; and the hour passing (the seal) changes nothing.
    make_turn(session=kept, seq=2, at=now - dt.timedelta(minutes=1), step_limit_hit=True)
    make_call(at=now - dt.timedelta(minutes=1), agent=agent, session=kept, prompt_tokens=100)
    later = metric_totals_by_agent(histograms=histograms, now=now)["deleted"]
    assert (later["turns"], later["step_limit_hits"], later["calls"], later["tokens"]) == (5, 4, 2, [1, 2])
    sealed = metric_totals_by_agent(histograms=histograms, now=now + dt.timedelta(hours=3))["deleted"]
    assert sealed == later


@pytest.mark.django_db
def test_the_kept_totals_outlive_the_cache_and_a_malformed_row_is_counted_afresh(alice: Any) -> None:
    from django.core.cache import cache

    from observability.models import MetricTotals

    now = timezone.now()
    agent = make_agent("kept")
    session = make_session(user=alice, agent=agent)
    make_turn(session=session, seq=1, at=now - dt.timedelta(minutes=5))
    assert metric_totals_by_agent(now=now)["kept"]["turns"] == 1
    session.delete()
    cache.clear()  # Redis restarted empty: the offset is in the database, the counter stays
    assert metric_totals_by_agent(now=now)["kept"]["turns"] == 1

    MetricTotals.objects.update(state=["not", "a", "state"])
    make_session(user=alice, agent=agent)
    make_call(at=now - dt.timedelta(hours=2), agent=agent)
    assert metric_totals_by_agent(now=now)["kept"]["calls"] == 1
