"""The booking example's agent, seeded through ``settings.AGENT_SEEDS`` as a package of yours would seed one.

``manage.py runstack`` creates it when it is missing (``agents.services.default_agents_ensure``), and only while
the ``flight_booking`` workflow is plugged in (``AGENT_WORKFLOWS``).
"""

from __future__ import annotations

BOOKING_PROMPT = (
    "You are a flight-booking assistant. Follow the current workflow step exactly: ask only for what is "
    "still missing, never for what is already collected, confirm before booking, and book with the "
    "book_flight tool."
)


def flight_booking_agent() -> dict[str, object]:
    """The ``flight-booking`` agent's fields (a fresh dict each call: the seeding may keep what it is given)."""
    return {
        "slug": "flight-booking",
        "name": "Flight booking",
        "description": "Books a flight step by step: origin, destination, dates, passengers, confirmation.",
        "system_prompt": BOOKING_PROMPT,
        "workflow": "flight_booking",
        "tools": ["search_flights"],
        "temperature": 0.0,
    }
