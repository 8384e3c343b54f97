from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agents.models import Agent
from sessions.models import ChatSession, Turn
from tests.world import make_agent


@pytest.fixture
def agent(db: Any) -> Agent:
    return make_agent("chat", slug="travel", name="Travel", system_prompt="You help with travel.")


@pytest.fixture
def make_turn(agent: Agent) -> Any:
    """A finished turn of ``user`` in a session of its own (or the given one)."""

    def make(
        user: Any, user_message: str, assistant_message: str = "Noted.", session: ChatSession | None = None
    ) -> Turn:
        session = session or ChatSession.objects.create(user=user, agent=agent, workflow="free_chat", state="CHATTING")
        seq = session.turns.count() + 1
        return Turn.objects.create(
            session=session,
            seq=seq,
            user_message=user_message,
            assistant_message=assistant_message,
            status=Turn.Status.COMPLETED,
        )

    return make


@pytest.fixture
def scripted(use_provider: Any) -> Any:
    """A scripted provider standing in for every model the memory app calls (the LLM is the edge)."""
    from llm.scripted import ScriptedProvider

    provider = ScriptedProvider()
    use_provider(provider)
    return provider


@pytest.fixture(autouse=True)
def _fresh_rerank_paces() -> Iterator[None]:
    """Each test starts with no reranker pace (it is kept per process, per endpoint)."""
    from memory.retrieval import relevance

    relevance._PACES.clear()
    yield
    relevance._PACES.clear()
