"""search_memory goes through the memory app's retrieval and sees only the user's own memories."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from agents.tools import ToolContext, run_tool_call
from llm.base import ToolCallRequest
from memory.models import Memory
from memory.services import memory_create
from tests.world import make_agent


def search(context: ToolContext, **arguments: Any) -> Any:
    call = ToolCallRequest(id="m1", name="search_memory", arguments=json.dumps(arguments))
    return run_tool_call(call=call, context=context, enabled=["search_memory"])


# transaction=True: the tool runs in a worker thread with its own connection, so the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_search_memory_finds_the_users_memories_and_never_anothers(alice: Any, bob: Any) -> None:
    agent = make_agent("memory", slug="helper")
    memory_create(user=alice, kind=Memory.Kind.SEMANTIC, text="Alice prefers aisle seats on long flights")
    memory_create(user=bob, kind=Memory.Kind.SEMANTIC, text="Bob prefers window seats on long flights")

    result = search(ToolContext(user=alice, agent=agent), query="seat preference on flights")
    assert result.ok, result.content
    assert result.content.startswith("Memories about the user matching 'seat preference on flights':")
    assert f"[semantic] ({timezone.now():%Y-%m-%d}) Alice prefers aisle seats on long flights" in result.content
    assert "Bob" not in result.content

    result = search(ToolContext(user=bob, agent=agent), query="seat preference on flights", limit=1)
    assert "Bob prefers window seats" in result.content and "Alice" not in result.content


@pytest.mark.django_db(transaction=True)
def test_search_memory_with_nothing_stored(alice: Any) -> None:
    result = search(ToolContext(user=alice), query="favourite airline")
    assert result.ok
    assert result.content == "No stored memories about the user match 'favourite airline'."


@pytest.mark.django_db
def test_search_memory_arguments_are_validated(alice: Any) -> None:
    result = search(ToolContext(user=alice), query="x" * 501, limit=50)
    assert result.error_kind == "invalid_arguments"
    assert "query: String should have at most 500 characters" in result.content
    assert "limit: Input should be less than or equal to 20 (got 50)" in result.content
