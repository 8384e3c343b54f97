"""API test fixtures: agents and token clients for each persona (the root conftest empties the cache per test)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agents.models import Agent
from tests.world import make_agent


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    # Three personas per test: the default PBKDF2 rounds would dominate the run time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def booking_agent(db: Any) -> Agent:
    return make_agent(
        name="Flight booker",
        slug="flight-booker",
        system_prompt="You book flights.",
        workflow="flight_booking",
        tools=["book_flight"],
    )


@pytest.fixture
def chat_agent(db: Any) -> Agent:
    return make_agent(name="Chatty", slug="chatty", system_prompt="You chat.", workflow="free_chat")


@pytest.fixture
def retired_agent(db: Any) -> Agent:
    return make_agent(name="Retired", slug="retired", system_prompt="Gone.", workflow="free_chat", is_active=False)


def token_client(user: Any) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def anon_client() -> APIClient:
    return APIClient()


@pytest.fixture
def alice_client(alice: Any) -> APIClient:
    return token_client(alice)


@pytest.fixture
def bob_client(bob: Any) -> APIClient:
    return token_client(bob)


@pytest.fixture
def staff_client(staff: Any) -> APIClient:
    return token_client(staff)


def assert_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is an error in the one API format, with this status (and code)."""
    assert response.status_code == status, (response.status_code, getattr(response, "content", b"")[:500])
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"code", "message", "details"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], dict)
    if code is not None:
        assert error["code"] == code, error
    return error
