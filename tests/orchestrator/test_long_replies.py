"""Long answers survive: a prose reply cut off by the token limit is continued over real HTTP (the fake
OpenAI server), and kept and marked as cut off when the continuations cannot finish it. The reply budget
follows the model's window unless an agent sets one."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from agents.models import Agent, LLMCall
from llm.continuation import (
    CONTINUE_INSTRUCTION,
    MAX_CONTINUATIONS,
    continuation_news,
    default_reply_tokens,
)
from llm.prompt import ContextBudget
from orchestrator.runtime import turn_run, turn_stream
from sessions.models import Turn
from sessions.services import session_create
from tests.fakes.openai_server import error, stream, tool_call
from tests.world import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat_agent(db: Any) -> Agent:
    return make_agent(name="Chat", slug="chat", system_prompt="Be thorough.", workflow="free_chat", tools=[])


def test_a_reply_cut_by_the_token_limit_arrives_whole_after_continuation(
    alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    remote_model.enqueue(
        stream("Step one: pack the bags. Step two:", finish_reason="length"),
        stream(" book the train. Step three:", finish_reason="length"),
        stream(" enjoy the trip."),
    )
    session = session_create(user=alice, agent=chat_agent)
    events = list(turn_stream(session=session, message="Write me a long plan."))
    turn = Turn.objects.get(session=session)
    whole = "Step one: pack the bags. Step two: book the train. Step three: enjoy the trip."
    assert turn.status == Turn.Status.COMPLETED, turn.error
    assert turn.assistant_message == whole
    assert not turn.truncated
    assert turn.composition["continuations"] == 2
    # The user saw every piece as it came, in order, and nothing twice.
    assert "".join(e["text"] for e in events if e["type"] == "delta") == whole
    done = next(e for e in events if e["type"] == "done")
    assert done["truncated"] is False and done["reply"] == whole

    requests = remote_model.chat_requests()
    assert len(requests) == 3
    # Each continuation sends the partial back as the assistant's words, then asks to go on.
    second = requests[1].messages
    assert second[-2] == {"role": "assistant", "content": "Step one: pack the bags. Step two:"}
    assert second[-1] == {"role": "user", "content": CONTINUE_INSTRUCTION}
    assert requests[2].messages[-2]["content"] == "Step one: pack the bags. Step two: book the train. Step three:"
    assert requests[0].messages == second[:-2]  # the original prompt, unchanged
    outcomes = list(LLMCall.objects.filter(turn=turn, purpose="reply").order_by("pk").values_list("outcome", flat=True))
    assert outcomes == ["truncated", "truncated", "ok"]


def test_a_reply_still_cut_after_its_continuations_is_kept_and_marked(
    alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    pieces = [f"Part {n} of a very long essay." for n in range(MAX_CONTINUATIONS + 1)]
    remote_model.enqueue(*(stream(p + " ", finish_reason="length") for p in pieces))
    session = session_create(user=alice, agent=chat_agent)
    result = turn_run(session=session, message="Write an essay that never ends.")
    turn = result.turn
    assert turn.status == Turn.Status.COMPLETED, turn.error
    assert turn.truncated is True
    whole = "".join(p + " " for p in pieces)
    assert turn.assistant_message == whole  # nothing lost
    assert len(remote_model.chat_requests()) == MAX_CONTINUATIONS + 1
    assert remote_model.pending() == 0

    client = APIClient()
    client.force_authenticate(alice)
    body = client.get(f"/api/sessions/{session.pk}/messages/").json()
    rows = body["results"] if isinstance(body, dict) else body
    assert rows[0]["truncated"] is True and rows[0]["assistant_message"] == whole


CUT = "The first half of the answer: take the early train, then"


@pytest.mark.parametrize(
    ("continuation", "calls"),
    [
        # Cut again, on and on: what each continuation added is kept, and the reply is still marked.
        ([stream(f" part {n},", finish_reason="length") for n in range(MAX_CONTINUATIONS)], MAX_CONTINUATIONS + 1),
        ([stream("")], 2),  # nothing at all, finish reason stop
        ([stream("  \n")], 2),  # only blanks
        ([stream(CUT)], 2),  # the reply so far, said again
        ([stream(" take the early train, then")], 2),  # its last words again
        ([stream(CUT, finish_reason="length")], 2),  # said again and cut at the same place: no use asking again
    ],
    ids=["cut-again", "empty", "blank", "repeats-all", "repeats-the-end", "repeats-and-cut"],
)
def test_a_continuation_that_adds_nothing_leaves_the_reply_marked_cut_off(
    alice: Any, chat_agent: Agent, remote_model: Any, continuation: list[Any], calls: int
) -> None:
    remote_model.enqueue(stream(CUT, finish_reason="length"), *continuation, stream("never asked for"))
    session = session_create(user=alice, agent=chat_agent)
    events = list(turn_stream(session=session, message="Explain at length."))
    turn = Turn.objects.get(session=session)
    added = "".join(f" part {n}," for n in range(MAX_CONTINUATIONS)) if calls > 2 else ""
    assert turn.status == Turn.Status.COMPLETED, turn.error
    assert turn.truncated is True and turn.composition["truncated"] is True
    assert turn.assistant_message == CUT + added  # kept as far as it went, nothing said twice
    assert len(remote_model.chat_requests()) == calls
    # The user saw the same: the cut-off reply once, and the note that it is cut off.
    assert "".join(e["text"] for e in events if e["type"] == "delta") == CUT + added
    done = next(e for e in events if e["type"] == "done")
    assert done["truncated"] is True and done["reply"] == CUT + added
    client = Client()
    client.force_login(alice)
    page = client.get(reverse("chat", args=[session.pk])).content.decode()
    assert "This reply was cut off at the length limit." in page and "continue-reply" in page


def test_a_continuation_that_starts_over_adds_only_what_is_new(
    alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    # A model that answers "continue" with the whole reply again, this time to its end.
    remote_model.enqueue(stream(CUT, finish_reason="length"), stream(CUT + " the ferry to the island."))
    session = session_create(user=alice, agent=chat_agent)
    events = list(turn_stream(session=session, message="Explain at length."))
    turn = Turn.objects.get(session=session)
    whole = CUT + " the ferry to the island."
    assert turn.status == Turn.Status.COMPLETED and not turn.truncated
    assert turn.assistant_message == whole
    assert "".join(e["text"] for e in events if e["type"] == "delta") == whole


def test_a_short_ending_that_occurs_earlier_still_completes_the_reply(
    alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    remote_model.enqueue(stream(CUT, finish_reason="length"), stream(" the"), stream("never asked for"))
    turn = turn_run(session=session_create(user=alice, agent=chat_agent), message="Explain.").turn
    assert not turn.truncated and turn.assistant_message == CUT + " the"


@pytest.mark.parametrize(
    ("continuation", "news"),
    [
        (" the ferry.", " the ferry."),  # new words
        ("", ""),
        (" \n ", ""),
        (CUT, ""),  # all of it again
        ("\n" + CUT + "\n", ""),
        (" take the early train,", ""),  # a part of it again
        (CUT + " the ferry.", " the ferry."),  # started over, then went further: only what is past the old text
        (" the", " the"),  # a short real ending that happens to occur earlier is kept
        ("The first half", ""),  # the start of a restart that stopped there
    ],
)
def test_what_a_continuation_adds(continuation: str, news: str) -> None:
    assert continuation_news(CUT, continuation) == news


def test_a_continuation_that_fails_keeps_what_was_said_marked(alice: Any, chat_agent: Agent, remote_model: Any) -> None:
    remote_model.enqueue(stream("The first half of the answer", finish_reason="length"), error(500), stream("unused"))
    session = session_create(user=alice, agent=chat_agent)
    turn = turn_run(session=session, message="Explain at length.").turn
    assert turn.status == Turn.Status.COMPLETED, turn.error
    assert turn.truncated and turn.assistant_message == "The first half of the answer"


def test_continuations_stop_when_the_grown_prompt_would_not_fit(
    alice: Any, chat_agent: Agent, remote_model: Any
) -> None:
    chat_agent.context_window = 2048
    chat_agent.max_tokens = 64
    chat_agent.save()
    budget = ContextBudget.from_agent(chat_agent)
    # A partial that alone takes most of the prompt's room: sending it back would overflow the window.
    long_partial = "word " * budget.prompt_limit
    remote_model.enqueue(stream(long_partial, finish_reason="length"), stream("never asked for"))
    session = session_create(user=alice, agent=chat_agent)
    turn = turn_run(session=session, message="Go on and on.").turn
    assert turn.status == Turn.Status.COMPLETED and turn.truncated
    assert len(remote_model.chat_requests()) == 1
    assert remote_model.pending() == 1


def test_a_tool_call_cut_off_is_not_continued(alice: Any, chat_agent: Agent, remote_model: Any) -> None:
    remote_model.enqueue(
        stream("", tool_calls=[tool_call("search_memory", {"query": "x"})], finish_reason="length"),
        stream("never asked for"),
    )
    session = session_create(user=alice, agent=chat_agent)
    turn = turn_run(session=session, message="Look it up.").turn
    assert turn.status == Turn.Status.FAILED
    assert len(remote_model.chat_requests()) == 1


def test_the_reply_budget_follows_the_window_unless_the_agent_sets_one(chat_agent: Agent) -> None:
    assert chat_agent.max_tokens is None
    assert ContextBudget.from_agent(chat_agent).reply_tokens == max(1024, chat_agent.context_window // 8)
    chat_agent.context_window = 32768
    assert ContextBudget.from_agent(chat_agent).reply_tokens == 4096
    chat_agent.context_window = 1024
    assert ContextBudget.from_agent(chat_agent).reply_tokens == 512  # never more than half the window
    chat_agent.max_tokens = 300
    assert ContextBudget.from_agent(chat_agent).reply_tokens == 300
    assert default_reply_tokens(8192) == 1024


def test_the_reply_call_asks_for_the_window_based_budget(alice: Any, chat_agent: Agent, remote_model: Any) -> None:
    remote_model.enqueue(stream("Short."))
    turn_run(session=session_create(user=alice, agent=chat_agent), message="Hi")
    assert remote_model.chat_requests()[0].body["max_tokens"] == 1024


@pytest.mark.parametrize("message", ["漢字かな交じり文。" * 112, "🙂" * 500], ids=["1000-cjk", "500-emoji"])
def test_a_long_message_in_any_script_is_answered_by_the_demo_model(
    alice: Any, chat_agent: Agent, message: str
) -> None:
    chat_agent.endpoint = "demo"
    chat_agent.save()
    session = session_create(user=alice, agent=chat_agent)
    turn = turn_run(session=session, message=message).turn
    assert turn.status == Turn.Status.COMPLETED, turn.error
    assert not turn.truncated
    # The demo quotes the message (as the prompt holds it: cut in the middle to its budget) and ends with its
    # closing sentence: the reply arrived whole.
    assert message[:100] in turn.assistant_message
    assert turn.assistant_message.endswith("to talk to a real model.")
