"""The failure gallery on its first turns (so it cannot rot), the script's hygiene, and the naive agent's loop."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest

from agents.models import LLMCall
from bench.gallery import WINDOW, conversation, gallery, gallery_demo_model, script_problems
from bench.naive_agent import ContextLengthExceeded, ModelFault, NaiveAgent, NaiveModel, asked_slots
from llm.continuation import MAX_CONTINUATIONS
from llm.providers import provider_override
from orchestrator.runtime import turn_run
from tests.world import make_agent


def _naive(tool: Any, *, window: int = WINDOW) -> NaiveAgent:
    from llm.tokens import counter_for
    from memory.embedding import get_embedder

    model = NaiveModel(counter=counter_for("demo"), today=date.today(), window=window)
    return NaiveAgent(
        model=model, tools={"search_flights": tool, "book_flight": tool}, embed=get_embedder("hashing").embed
    )


def test_the_script_says_what_the_parsers_read() -> None:
    # Both models read slots with the demo's parsers; a message they misread would measure the model, not the
    # architecture. Every message states exactly the slots the script says, and none reads as a change request.
    assert script_problems(conversation(date.today()), today=date.today()) == []
    assert len(conversation(date.today())) == 60


def test_the_naive_loop_loses_the_message_of_a_turn_whose_tool_raised() -> None:
    def broken(slots: dict[str, Any]) -> str:
        raise KeyError("data")

    agent = _naive(broken)
    for text in [
        "I'd like to book a flight from Lisbon to Oslo.",
        "We fly out on March 5 2031 and back on March 12 2031.",
    ]:
        assert agent.run_turn(text).reply
    crashed = agent.run_turn("We are 2 passengers. Which flights are there on the outbound leg?")
    assert crashed.reply is None and crashed.error.startswith("KeyError")
    with pytest.raises(KeyError):
        agent.handle("Which flights are there on the outbound leg?")
    # The passenger count died with the turn: the next answer asks for it again.
    after = agent.run_turn("Is there wifi on board?")
    assert after.reply and asked_slots(after.reply) == ["passengers"]
    assert len(agent.history) == 3


def test_the_naive_loop_routes_on_substrings_and_refuses_a_prompt_over_its_window() -> None:
    searched: list[dict[str, Any]] = []

    def search(slots: dict[str, Any]) -> str:
        searched.append(slots)
        return "Flights from Lisbon to Oslo:\n1. XX100"

    agent = _naive(search)
    agent.run_turn("I'd like to book a flight from Lisbon to Oslo on March 5 2031.")
    agent.model.fault = ModelFault(free_text="search for more information")
    turn = agent.run_turn("Is a visa needed in Norway?")
    assert turn.branch == "search" and len(searched) == 1  # "search" in the text picked the tool branch
    agent.model.fault = ModelFault(free_text="検索する")
    assert agent.run_turn("Which flights are there on the outbound leg?").branch == "answer"

    small = _naive(lambda slots: "", window=60)
    refused = small.run_turn("Hello there, I would like some help planning a trip with my partner next spring.")
    assert refused.reply is None and not refused.accepted and refused.prompt_tokens > 60
    assert ContextLengthExceeded.__name__ in refused.error


@pytest.mark.django_db
@pytest.mark.parametrize("case", ["continued", "cut_again", "empty", "repeats"])
def test_the_demo_model_cut_off_and_asked_to_continue_through_the_turn(alice: Any, case: str) -> None:
    # The gallery's fault injection on the demo provider: the reply call is cut at half its length, and the
    # request to continue is answered as a real endpoint may answer it.
    from sessions.services import session_create

    agent = make_agent("chat", system_prompt="Be thorough.")
    model = gallery_demo_model()
    model.turn_begins(ModelFault(truncate=case))
    with provider_override(model):
        turn = turn_run(session=session_create(user=alice, agent=agent), message="Tell me about trains.").turn
    [whole], [cut] = model.whole_texts, model.cut_texts
    outcomes = list(LLMCall.objects.filter(turn=turn, purpose="reply").order_by("pk").values_list("outcome", flat=True))
    assert turn.status == turn.Status.COMPLETED, turn.error
    if case == "continued":
        assert not turn.truncated and turn.assistant_message == whole
        assert outcomes == ["truncated", "ok"]
    elif case == "cut_again":
        # Each continuation added the next part and was cut again: kept as far as it went, still marked.
        assert turn.truncated and turn.assistant_message.startswith(cut) and cut != turn.assistant_message
        assert whole.startswith(turn.assistant_message) and whole != turn.assistant_message
        assert outcomes == ["truncated"] * (MAX_CONTINUATIONS + 1)
    else:  # empty, or the same words again: nothing was added, the cut-off reply stays as it was, marked
        assert turn.truncated and turn.assistant_message == cut
        assert outcomes == ["truncated", "ok"]


@pytest.mark.django_db
def test_gallery_on_the_first_turns(alice: Any) -> None:
    result = gallery(user=alice, turns=14)
    naive, app = result["agents"]["naive"], result["agents"]["app"]
    # Turns 8 (503 burst) and 13 (400) raise out of the naive loop; the app retries the 503s and explains the 400.
    assert naive["crashed_turns"] == [8, 13]
    assert app["crashes"] == 0 and app["misroutes"] == 0 and app["repeated_questions"] == 0
    # The 400 turn carried the passenger count: the naive agent asks for it again, the app has it.
    assert {"turn": 14, "slots": ["passengers"]} in naive["repeated_detail"]
    assert "passengers" in naive["lost_data"] and "passengers" not in app["lost_data"]
    # "Search" on turn 11 sent the naive agent to the flight search; the app never routes on free text.
    assert [d["turn"] for d in naive["misroute_detail"]] == [11]
    assert 0 < app["max_prompt_tokens"] <= WINDOW
    assert len(result["replies"]["app"]) == 14 and all(result["replies"]["app"])


@pytest.mark.django_db(transaction=True)
def test_the_whole_gallery_on_the_demo_model(alice: Any) -> None:
    # All 60 turns (about 11 s): the app's whole column, as docs/reliability.md shows it. Transactions commit,
    # as in `python -m bench gallery`: the summaries (sent on commit) keep the prompt flat.
    result = gallery(user=alice, turns=60)
    app, naive = result["agents"]["app"], result["agents"]["naive"]
    assert app["crashes"] == 0 and all(result["replies"]["app"])
    assert app["cut_replies_shown"] == 0
    assert app["repeated_questions"] == 0 and app["misroutes"] == 0 and app["other_wrong_branches"] == []
    assert app["lost_data"] == []
    assert app["prompt_growth_per_turn"] < 2
    assert 0 < app["max_prompt_tokens"] <= WINDOW
    # Each way an endpoint answers a request to continue, as the user got it: the continued reply whole; the
    # others kept as far as they went, marked cut off. The naive agent shows every cut-off reply as whole.
    cases = {d["continuation"]: d["outcome"] for d in app["cut_off_detail"]}
    assert cases == {"continued": "whole", "cut_again": "marked", "empty": "marked", "repeats": "marked"}
    assert app["cut_replies_marked"] == 3
    assert {d["outcome"] for d in naive["cut_off_detail"]} == {"shown as whole"}
    assert naive["cut_replies_shown"] == 4
