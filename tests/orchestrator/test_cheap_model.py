"""Which model each call goes to: the reply to the endpoint's model, the helper calls (relevance filter, fact
extraction, summaries) to its cheaper one, over real HTTP to the fake OpenAI-compatible server."""

from __future__ import annotations

from typing import Any

import pytest

from memory.retrieval import memories_for_prompt
from memory.services import memory_create, turn_memories_write
from orchestrator.runtime import turn_run
from sessions.models import Turn
from sessions.services import session_create
from sessions.summaries import summarize_session_through
from tests.fakes import openai_server as fake
from tests.world import make_agent

pytestmark = pytest.mark.django_db


def test_the_reply_uses_the_model_and_the_helpers_the_cheap_model(alice: Any, settings: Any, fake_openai: Any) -> None:
    settings.LLM_PROFILES = {"default": fake_openai.profile(model="big", cheap_model="small", max_retries=0)}
    agent = make_agent("chat")
    session = session_create(user=alice, agent=agent)
    memory_create(user=alice, kind="semantic", text="The user likes sailing on the lake.")

    fake_openai.enqueue(fake.json_reply({"order": [1]}), fake.stream("Ahoy."))
    turn = turn_run(session=session, message="Where do I like sailing?").turn
    fake_openai.enqueue(fake.json_reply({"facts": []}))
    turn_memories_write(turn_id=turn.pk)
    fake_openai.enqueue(fake.reply("The user asked where they like sailing."))
    summarize_session_through(session_id=session.pk, through_seq=turn.seq)
    fake_openai.enqueue(fake.json_reply({"order": [1]}))
    memories_for_prompt(user=alice, query="sailing lake", budget_tokens=500, touch=False)

    sent = [(r.body["model"], r.body["messages"][0]["content"][:40]) for r in fake_openai.chat_requests()]
    assert [model for model, _ in sent] == ["small", "big", "small", "small", "small"], sent
    assert Turn.objects.get(pk=turn.pk).assistant_message == "Ahoy."


def test_a_follow_up_is_searched_as_the_cheap_model_rewrites_it(alice: Any, settings: Any, fake_openai: Any) -> None:
    """With earlier messages in the session, the cheap model turns the new one into a standalone query (one
    short call before retrieval); when that call fails, the message is searched with its context instead."""
    settings.LLM_PROFILES = {"default": fake_openai.profile(model="big", cheap_model="small", max_retries=0)}
    agent = make_agent("chat")
    session = session_create(user=alice, agent=agent)
    fake_openai.enqueue(fake.stream("Lovely city."))
    turn_run(session=session, message="I moved to Lisbon last spring.")

    fake_openai.enqueue(fake.json_reply({"query": "weather in Lisbon"}), fake.stream("Sunny."))
    second = turn_run(session=session, message="What is the weather like there?").turn

    report = Turn.objects.get(pk=second.pk).retrieval
    assert report["query"] == "weather in Lisbon" and report["query_source"] == "rewrite"
    rewrite = fake_openai.chat_requests()[1]
    assert rewrite.body["model"] == "small"
    assert "I moved to Lisbon last spring." in rewrite.body["messages"][1]["content"]

    fake_openai.enqueue(fake.error(500, "down"), fake.stream("Still sunny."))
    third = turn_run(session=session, message="And in winter?").turn

    report = Turn.objects.get(pk=third.pk).retrieval
    assert report["query_source"] == "conversation"
    assert report["query"].startswith("And in winter?\n") and "What is the weather like there?" in report["query"]
    assert Turn.objects.get(pk=third.pk).assistant_message == "Still sunny."
