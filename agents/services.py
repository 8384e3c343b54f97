from __future__ import annotations

from agents.models import Agent
from agents.workflows import workflow_choices

ASSISTANT_PROMPT = (
    "You are a helpful, concise assistant. Use what you remember about the user when it helps, "
    "and say so when you do not know something."
)
BOOKING_PROMPT = (
    "You are a flight-booking assistant. Follow the current workflow step exactly: ask only for what is "
    "still missing, never for what is already collected, confirm before booking, and book with the "
    "book_flight tool."
)

DEFAULT_AGENTS: list[dict[str, object]] = [
    {
        "slug": "assistant",
        "name": "Assistant",
        "description": "Free chat with memory.",
        "system_prompt": ASSISTANT_PROMPT,
        "workflow": "free_chat",
        "tools": ["search_memory"],
    },
    {
        "slug": "flight-booking",
        "name": "Flight booking",
        "description": "Books a flight step by step: origin, destination, dates, passengers, confirmation.",
        "system_prompt": BOOKING_PROMPT,
        "workflow": "flight_booking",
        "tools": ["search_flights"],
        "temperature": 0.0,
    },
]


def default_agents_ensure() -> list[Agent]:
    """Create the shipped agents if they are missing; never overwrite what operators changed."""
    agents = []
    workflows = {name for name, _title in workflow_choices()}
    for spec in DEFAULT_AGENTS:
        if spec["workflow"] not in workflows:
            continue  # its example is not plugged in (AGENT_WORKFLOWS): no agent that could not answer
        fields = {k: v for k, v in spec.items() if k != "slug"}
        agent, _ = Agent.objects.get_or_create(slug=str(spec["slug"]), defaults=fields)
        agents.append(agent)
    return agents
