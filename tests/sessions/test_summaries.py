"""Progressive summaries: when they are due, the model path, the extractive fallback, the real worker."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent
from conftest import wait_for
from llm.base import CallContext, LLMConnectionError
from llm.scripted import ScriptedProvider, ScriptedReply
from llm.tokens import counter_for
from sessions.context import DEFAULT_SHARES, ContextBudget, TurnText
from sessions.models import ChatSession, Turn
from sessions.summaries import extractive_summary, summarize_session_through, summary_due, summary_request_if_due
from tests.world import make_agent

COUNTER = counter_for("")
FACT = "My frequent flyer number is QX-4471 and I am allergic to peanuts."


def small_budget(window_turns: int = 5) -> ContextBudget:
    return ContextBudget(
        window=8192,
        response_reserve=768,
        safety_margin=0.12,
        shares=dict(DEFAULT_SHARES),
        window_turns=window_turns,
        memory_budget_tokens=2000,
    )


def texts(n: int) -> list[TurnText]:
    return [TurnText(seq=i, user=f"short question {i}", assistant=f"short answer {i}") for i in range(1, n + 1)]


def test_summary_is_due_a_little_before_turns_leave_the_window_and_in_batches() -> None:
    b = small_budget(window_turns=5)
    # 8 turns, window 4..8: turns 1-3 left, and with a lead of 2 turns 4-5 leave soon.
    assert summary_due(turns=texts(8), budget=b, counter=COUNTER, through_seq=0) == 5
    assert summary_due(turns=texts(8), budget=b, counter=COUNTER, through_seq=5) == 0
    # One new turn to fold in and none has left yet: wait for a batch.
    assert summary_due(turns=texts(8), budget=b, counter=COUNTER, through_seq=4) == 0
    # Too few turns for anything to leave: nothing due.
    assert summary_due(turns=texts(3), budget=b, counter=COUNTER, through_seq=0) == 0


def test_long_turns_leave_the_window_sooner() -> None:
    b = small_budget(window_turns=20)
    long_turns = [TurnText(seq=i, user="word " * 900, assistant="reply " * 500) for i in range(1, 11)]
    # The recent budget holds about two of these turns, but the window never goes below three.
    assert summary_due(turns=long_turns, budget=b, counter=COUNTER, through_seq=0) == 9


@pytest.fixture
def agent(db: Any) -> Agent:
    return make_agent(name="Summ", slug="summ", system_prompt="You help.", window_turns=3)


def make_session(user: Any, agent: Agent, n_turns: int, *, first: str = FACT) -> ChatSession:
    session = ChatSession.objects.create(user=user, agent=agent, workflow="free_chat", state="CHATTING")
    for seq in range(1, n_turns + 1):
        Turn.objects.create(
            session=session,
            seq=seq,
            user_message=first if seq == 1 else f"ok thanks, next question number {seq} about seats please",
            assistant_message=f"Sure, seat rule {seq} applies.",
            status=Turn.Status.COMPLETED,
        )
    return session


def test_request_enqueues_once_after_commit(
    alice: Any, agent: Agent, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, int]] = []
    monkeypatch.setattr("web.tasks.sessions.summarize_session.delay", lambda sid, seq: sent.append((sid, seq)))
    session = make_session(alice, agent, 6)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert summary_request_if_due(session=session) is True
        assert sent == []  # nothing leaves before the commit
    assert len(callbacks) == 1
    assert sent == [(str(session.pk), 5)]  # window 4..6, lead 2: through turn 5
    session.refresh_from_db()
    assert session.summary_requested_seq == 5
    # Already requested and not yet done: no second task.
    assert summary_request_if_due(session=session) is False
    assert len(sent) == 1


def test_one_request_in_flight_until_a_batch_more_is_due(
    alice: Any, agent: Agent, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[int] = []
    monkeypatch.setattr("web.tasks.sessions.summarize_session.delay", lambda sid, seq: sent.append(seq))
    session = make_session(alice, agent, 6)

    def finish_turn(seq: int) -> bool:
        Turn.objects.create(
            session=session,
            seq=seq,
            user_message=f"question {seq}",
            assistant_message="answer",
            status=Turn.Status.COMPLETED,
        )
        with django_capture_on_commit_callbacks(execute=True):
            return summary_request_if_due(session=session)

    with django_capture_on_commit_callbacks(execute=True):
        assert summary_request_if_due(session=session) is True
    assert sent == [5]
    # The worker lags: the next turn makes one more turn due, and no second task goes out for it ...
    assert finish_turn(7) is False and sent == [5]
    # ... until a batch more is due (a lost request is superseded then).
    assert finish_turn(8) is True and sent == [5, 7]
    # Once the summary has caught up, the next due batch is requested at once.
    ChatSession.objects.filter(pk=session.pk).update(summary_through_seq=7)
    session.refresh_from_db()
    assert finish_turn(9) is False and finish_turn(10) is True and sent == [5, 7, 9]


def test_model_summary_is_stored_and_the_service_is_idempotent(alice: Any, agent: Agent) -> None:
    session = make_session(alice, agent, 6)
    provider = ScriptedProvider(["- Frequent flyer QX-4471; allergic to peanuts.\n- Pending: seat choice."])
    assert summarize_session_through(session_id=session.pk, through_seq=4, provider=provider) is True
    session.refresh_from_db()
    assert session.summary.startswith("- Frequent flyer QX-4471")
    assert session.summary_through_seq == 4
    request = provider.requests[0]
    assert request.purpose == "summarize" and request.temperature == 0
    limit = ContextBudget.from_agent(agent).section_limit("summary")
    assert request.max_tokens == limit
    prompt = "\n".join(m["content"] for m in request.messages)
    for word in ("decisions", "facts", "actions", "pending", "Drop"):
        assert word in prompt
    assert FACT in prompt and "Turn 4:" in prompt and "Turn 5:" not in prompt
    # Running again (a redelivered task) changes nothing and calls no model.
    assert summarize_session_through(session_id=session.pk, through_seq=4, provider=provider) is False
    assert len(provider.requests) == 1
    # The next batch merges with the existing summary.
    provider.add("- merged")
    assert summarize_session_through(session_id=session.pk, through_seq=6, provider=provider) is True
    assert "QX-4471" in provider.requests[1].messages[1]["content"]
    session.refresh_from_db()
    # The merge dropped what the user stated on turn 1: it is added back in the user's words.
    assert session.summary.startswith("- merged\n") and session.summary_through_seq == 6
    assert f"- t1 user: {FACT}" in session.summary


GALLERY_TURNS = [
    TurnText(seq=1, user="Hi, my name is Dana Whitfield and my frequent flyer number is QX-4471.", assistant="Hi!"),
    TurnText(seq=2, user="I'd like to book a flight from Lisbon to Oslo.", assistant="Sure, when?"),
    TurnText(
        seq=3,
        user="I have a peanut allergy; peanuts make me very ill, so I always need a nut-free meal.",
        assistant="Noted.",
    ),
    TurnText(seq=4, user="My partner Sam Ortega is travelling with me, he prefers the aisle seat.", assistant="Ok."),
    TurnText(seq=5, user="How early should we be at the airport in Lisbon?", assistant="Two hours."),
    TurnText(seq=6, user="We are 2 passengers. Which flights leave in the morning?", assistant="Let me look."),
]


def _summarize_with(model_summary: str, limit: int = 300) -> str:
    from sessions.summaries import summarize_turns

    provider = ScriptedProvider([model_summary])
    return summarize_turns(
        previous="",
        turns=GALLERY_TURNS,
        limit=limit,
        provider=provider,
        counter=COUNTER,
        ctx=CallContext(purpose="summarize"),
        prompt_limit=4000,
    )


def test_what_the_user_stated_survives_a_model_summary_that_drops_it(db: Any) -> None:
    """A small model's summary (a real one, Gemma 3 270M, quoted the chat's start instead): every fact the
    user stated is still in the stored summary, in the user's words; their questions are not facts."""
    summary = _summarize_with("- The user greeted the assistant.\n- The assistant said hi.")
    assert summary.startswith("- The user greeted the assistant.")
    for fact in ("Dana Whitfield", "QX-4471", "Lisbon to Oslo", "peanut allergy", "Sam Ortega", "2 passengers"):
        assert fact in summary, (fact, summary)
    assert "How early" not in summary and "Which flights" not in summary
    assert COUNTER.count(summary) <= 300


def test_a_model_summary_that_carries_the_facts_is_kept_as_written(db: Any) -> None:
    written = (
        "- Dana Whitfield (frequent flyer QX-4471) books a flight Lisbon to Oslo for 2 passengers.\n"
        "- Peanut allergy: always needs a nut-free meal. Partner Sam Ortega travelling too, prefers the aisle."
    )
    assert _summarize_with(written) == written


def test_stated_facts_take_at_most_half_the_summary_budget_and_the_model_summary_is_shortened_to_fit(
    db: Any,
) -> None:
    model_summary = "\n".join(f"- point {i}: the assistant explained rule {i} of the booking." for i in range(40))
    summary = _summarize_with(model_summary, limit=120)
    assert COUNTER.count(summary) <= 120
    assert "- point" in summary  # the model's own lines keep the other half
    kept = [line for line in summary.splitlines() if " user: " in line]
    assert kept and sum(COUNTER.count(line) + 1 for line in kept) <= 60


class ForgetfulModel(ScriptedProvider):
    """A small model's summaries (Gemma 3 270M's in the gallery): it quotes the chat's last lines, as many as
    its token limit allows, and keeps none of what the user stated earlier."""

    def _request(self, messages: Any, **kwargs: Any) -> Any:
        from llm.provider_base import RawCompletion

        transcript = str(messages[-1]["content"]).split("New turns:\n", 1)[-1]
        quoted: list[str] = []
        for line in reversed([ln for ln in transcript.splitlines() if ln.startswith(("User:", "Assistant:"))]):
            if COUNTER.count("\n".join([f"- {line}", *quoted])) > (kwargs.get("max_tokens") or 0):
                break
            quoted.insert(0, f"- {line}")
        return RawCompletion(text="\n".join(quoted), finish_reason="stop", model=self.model)


@pytest.mark.parametrize(
    ("window", "reply_tokens"),
    [(4096, 96), (8192, None)],
    ids=["gemma-270m-budget", "demo-budget"],
)
def test_every_early_fact_of_the_gallery_survives_60_turns_of_a_forgetful_model(
    db: Any, window: int, reply_tokens: int | None
) -> None:
    """The failure gallery's conversation (``bench.gallery``), its user turns folded into the summary two by two
    as the task does, by a model that keeps none of the user's facts: at turn 60 (the window holds turns 51-60)
    every early fact is still in the summary. On Gemma's budget (a 4,096-token window, 96-token replies: a
    340-token summary, 170 of them for stated facts) the companion ("My partner Sam Ortega …", scored 2.0, the
    lowest that counts) was dropped first, behind a quoted email and a complaint."""
    from datetime import date

    from bench.gallery import FACTS, conversation
    from llm.continuation import default_reply_tokens
    from sessions.summaries import summarize_turns

    budget = ContextBudget(
        window=window,
        response_reserve=max(768, reply_tokens or default_reply_tokens(window)),
        safety_margin=0.12,
        shares=dict(DEFAULT_SHARES),
        window_turns=10,
    )
    limit = budget.section_limit("summary")
    script = conversation(date.today())
    turns = [TurnText(seq=i, user=t.text, assistant="Happy to help with that.") for i, t in enumerate(script, 1)]
    model = ForgetfulModel(model="")
    summary = ""
    for start in range(0, 50, 2):
        summary = summarize_turns(
            previous=summary,
            turns=turns[start : start + 2],
            limit=limit,
            provider=model,
            counter=COUNTER,
            ctx=CallContext(purpose="summarize"),
            prompt_limit=budget.prompt_limit,
            earlier=turns[:start],
        )
        assert COUNTER.count(summary) <= limit
    assert summary.startswith("- User:") or summary.startswith("- Assistant:")  # the model's own lines kept too
    lost = [name for name, markers in FACTS.items() if not any(m in summary for m in markers)]
    assert lost == [], summary


def test_a_person_of_the_users_named_is_a_personal_fact_and_a_quoted_letter_is_not_the_users() -> None:
    from bench.gallery import EMAIL
    from sessions.summaries.extractive import _score, stated_facts

    # "he prefers" is not "I prefer", and "My partner Sam" is not "my … is": it scored 2.0, the lowest that counts.
    assert _score("My partner Sam Ortega is travelling with me, he prefers the aisle seat.") == 4.0
    assert _score("I went there with my son Leo last year.") >= 2.0
    assert _score("My old travel agent sent me this last year.") < 2.0
    facts = [
        sentence for _, _, sentence in stated_facts(previous="", turns=[TurnText(seq=10, user=EMAIL, assistant="")])
    ]
    assert not any("Whitfield" in f or "preferences on file" in f for f in facts), facts
    assert any("I do not use that agency any more" in f for f in facts)


def test_a_number_or_name_is_kept_only_as_a_word_of_its_own() -> None:
    from sessions.summaries.extractive import _kept

    assert not _kept("We are 2 passengers.", "- Outbound on March 12 2027 for the passengers.")
    assert _kept("We are 2 passengers.", "- Booking for 2 passengers.")
    assert not _kept("My partner Sam is travelling too.", "- The same partner is travelling.")
    assert _kept("My frequent flyer number is QX-4471.", "- Frequent flyer QX-4471 on file (number).")


def test_facts_that_name_something_new_go_first_and_a_carried_line_ranks_as_its_turn(db: Any) -> None:
    from sessions.summaries.extractive import _score, with_stated_facts

    story = "I am still upset that on my awful last trip the flight was late and nobody told us anything at all."
    route = "I'd like to book a flight from Lisbon to Oslo."
    turns = [TurnText(seq=2, user=route, assistant=""), TurnText(seq=5, user=story, assistant="")]
    assert _score(route) == _score(story) == 3.0
    room_for_one = 2 * (COUNTER.count(f"- t5 user: {story}") + 1)
    # Both score 3.0: the place named goes first, though the story is newer; the story does not fit after it.
    summary = with_stated_facts("- hello", previous="", turns=turns, limit=room_for_one, counter=COUNTER)
    assert "Lisbon" in summary and "awful trip" not in summary
    # The same line carried from the previous summary is chosen as when it came from the turns.
    again = with_stated_facts("- hello", previous=summary, turns=turns[1:], limit=room_for_one, counter=COUNTER)
    assert f"- t2 user: {route}" in again and "awful trip" not in again


def test_summary_never_moves_backwards(alice: Any, agent: Agent) -> None:
    session = make_session(alice, agent, 6)
    ChatSession.objects.filter(pk=session.pk).update(summary="newer", summary_through_seq=5)
    provider = ScriptedProvider(["older"])
    assert summarize_session_through(session_id=session.pk, through_seq=4, provider=provider) is False
    session.refresh_from_db()
    assert (session.summary, session.summary_through_seq) == ("newer", 5)
    assert provider.requests == []


@pytest.mark.parametrize(
    "failure",
    [LLMConnectionError("endpoint down"), ScriptedReply(text="- cut off mid", finish_reason="length")],
    ids=["unavailable", "truncated"],
)
def test_model_failure_falls_back_to_a_bounded_extractive_summary(alice: Any, agent: Agent, failure: Any) -> None:
    session = make_session(alice, agent, 6)
    assert summarize_session_through(session_id=session.pk, through_seq=4, provider=ScriptedProvider([failure])) is True
    session.refresh_from_db()
    assert "QX-4471" in session.summary and "cut off mid" not in session.summary
    assert session.summary.startswith("- t1 user:")
    assert session.summary_through_seq == 4


def test_extractive_summary_keeps_facts_drops_filler_and_stays_bounded() -> None:
    turns = [TurnText(seq=1, user=FACT, assistant="Noted, I will request a nut-free meal.")]
    turns += [
        TurnText(seq=i, user="ok thanks", assistant=f"Flight SK{i} leaves at 10:{i % 60:02d} from gate {i}.")
        for i in range(2, 400)
    ]
    summary = ""
    for start in range(0, len(turns), 5):  # folded in batch by batch, like the task does
        summary = extractive_summary(previous=summary, turns=turns[start : start + 5], limit=300, counter=COUNTER)
        assert COUNTER.count(summary) <= 300
    assert "QX-4471" in summary
    assert "ok thanks" not in summary
    assert "SK399" in summary  # newer lines win over older ones of the same weight


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_the_task_runs_on_a_real_worker(celery_worker: Any, alice: Any) -> None:
    # No LLM is configured in tests: the worker's get_provider gives the demo model.
    agent = make_agent(name="W", slug="w-summ", system_prompt="You help.", window_turns=3)
    session = make_session(alice, agent, 7)
    assert summary_request_if_due(session=session) is True  # autocommit: sent at once

    def summarized() -> bool:
        session.refresh_from_db()
        return session.summary_through_seq >= 6

    wait_for(summarized, timeout=60, message=f"the summary task on the worker\n{celery_worker.log_text()[-2000:]}")
    assert "QX-4471" in session.summary
    assert session.summary_requested_seq == 6


@pytest.mark.django_db
@pytest.mark.parametrize(("cap", "told"), [(200, True), (10, True), (4, False)])
def test_the_history_a_turn_read_gives_the_summary_check_the_turns_it_would_read_again(
    alice: Any, cap: int, told: bool
) -> None:
    """The runtime reads the history once per turn and hands it to the summary check with the finished turn:
    that must be exactly the newest turns the check would read (gaps of failed turns included), or nothing
    when the read stopped too early to know them."""
    from sessions.context import turn_history
    from sessions.summaries import checked_turns, newest_turns

    agent = make_agent(name="W5", slug="w5", system_prompt="x", workflow="free_chat", window_turns=5)
    session = ChatSession.objects.create(user=alice, agent=agent, workflow="free_chat", state="CHATTING")
    for seq in range(1, 22):
        status = Turn.Status.FAILED if seq in (7, 15, 19) else Turn.Status.COMPLETED
        Turn.objects.create(
            session=session, seq=seq, user_message=f"u{seq}", assistant_message=f"a{seq}", status=status
        )
    current = Turn.objects.create(session=session, seq=22, user_message="u22", status=Turn.Status.RUNNING)
    history = turn_history(session=session, before_seq=22, cap=cap)  # read while the turn runs
    Turn.objects.filter(pk=current.pk).update(status=Turn.Status.COMPLETED, assistant_message="a22")

    budget = ContextBudget.from_agent(agent)
    wanted = checked_turns(budget)
    assert wanted == 8  # a window of 5, 2 lead turns and the one that finished
    handed = history.newest_with(TurnText(seq=22, user="u22", assistant="a22"), wanted)
    if told:
        assert handed == newest_turns(session=session, budget=budget)
        assert [t.seq for t in handed][-3:] == [20, 21, 22] and 19 not in [t.seq for t in handed]
    else:  # 5 rows read (the window), the check looks at 8 turns: it must read them itself
        assert history.truncated and handed is None
