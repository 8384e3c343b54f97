"""The world the tests build on, in one place: an agent of each kind and a session in each state.

Tests take the fixtures of the root ``conftest.py`` (``chat_agent``, ``booking_session``, ``handed_off_session``,
...) or call these builders for a variation (``make_agent("chat", step_limit=2)``). Each kind is a persona a
user meets in the product:

- ``chat``: a free chat with no tools (asking for a person is the model's hand-off tool);
- ``tools``: a free chat that may search flights (routed by a structured call);
- ``booking``: the flight-booking workflow (slots, decisions, an action state that books);
- ``memory``: a free chat that may search the user's memories.
"""

from __future__ import annotations

from typing import Any

from agents.models import Agent
from sessions.models import ChatSession
from sessions.services import session_create

AGENT_KINDS: dict[str, dict[str, Any]] = {
    "chat": {"name": "Chat", "system_prompt": "Be brief.", "workflow": "free_chat", "tools": []},
    "tools": {"name": "Flights", "system_prompt": "x", "workflow": "free_chat", "tools": ["search_flights"]},
    "booking": {"name": "Booker", "system_prompt": "You book flights.", "workflow": "flight_booking", "tools": []},
    "memory": {"name": "Helper", "system_prompt": "Help.", "workflow": "free_chat", "tools": ["search_memory"]},
}


def make_agent(kind: str = "chat", *, slug: str | None = None, **fields: Any) -> Agent:
    """An agent of ``kind`` (``AGENT_KINDS``); ``fields`` override the kind's. Its slug is the kind unless given
    (``chat-2``, ``chat-3``, ... for the next ones)."""
    if slug is None:
        slug, n = kind, 1
        while Agent.objects.filter(slug=slug).exists():
            n += 1
            slug = f"{kind}-{n}"
    return Agent.objects.create(slug=slug, **{**AGENT_KINDS[kind], **fields})


def make_session(user: Any, agent: Agent, *, title: str = "", **fields: Any) -> ChatSession:
    """A session of ``user`` with ``agent`` in its workflow's initial state, as a door creates it; ``fields``
    (``state``, ``status``, ``data``, ...) are then written as they are, for a session further along."""
    session = session_create(user=user, agent=agent, title=title)
    if fields:
        ChatSession.objects.filter(pk=session.pk).update(**fields)
        session.refresh_from_db()
    return session
