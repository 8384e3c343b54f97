"""Web test fixtures: the API tests' agents and fast password hashing."""

from __future__ import annotations

from tests.api.conftest import _fast_passwords, booking_agent, chat_agent

__all__ = ["_fast_passwords", "booking_agent", "chat_agent"]
