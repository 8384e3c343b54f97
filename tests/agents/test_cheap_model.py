"""Which model each call goes to: the reply to the endpoint's model, the helper calls (relevance filter, fact
extraction, summaries) to its cheaper one, over real HTTP to the fake OpenAI-compatible server."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent
from agents.runtime import turn_run
from memory.selectors import memories_for_prompt
from memory.services import memory_create, turn_memories_write
from sessions.models import Turn
from sessions.services import session_create
from sessions.summaries import summarize_session_through
from tests.fakes import openai_server as fake

pytestmark = pytest.mark.django_db


def test_the_reply_uses_the_model_and_the_helpers_the_cheap_model(alice: Any, settings: Any, fake_openai: Any) -> None:
    settings.LLM_PROFILES = {"default": fake_openai.profile(model="big", cheap_model="small", max_retries=0)}
    agent = Agent.objects.create(name="Chat", slug="chat", system_prompt="Be brief.", workflow="free_chat")
    session = session_create(user=alice, agent=agent)
    memory = memory_create(user=alice, kind="semantic", text="The user likes sailing on the lake.")

    fake_openai.enqueue(fake.json_reply({"scores": [{"id": memory.pk, "score": 0.9}]}), fake.stream("Ahoy."))
    turn = turn_run(session=session, message="Where do I like sailing?").turn
    fake_openai.enqueue(fake.json_reply({"facts": []}))
    turn_memories_write(turn_id=turn.pk)
    fake_openai.enqueue(fake.reply("The user asked where they like sailing."))
    summarize_session_through(session_id=session.pk, through_seq=turn.seq)
    fake_openai.enqueue(fake.json_reply({"scores": [{"id": memory.pk, "score": 0.9}]}))
    memories_for_prompt(user=alice, query="sailing lake", budget_tokens=500, touch=False)

    sent = [(r.body["model"], r.body["messages"][0]["content"][:40]) for r in fake_openai.chat_requests()]
    assert [model for model, _ in sent] == ["small", "big", "small", "small", "small"], sent
    assert Turn.objects.get(pk=turn.pk).assistant_message == "Ahoy."
