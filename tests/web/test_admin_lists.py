"""The admin's change lists of the tables that grow by rows a turn read no whole table on a page: no count of
all rows next to the filtered one, no sidebar built from a column's distinct values, no list of dates; the
unfiltered count of a big table is the planner's estimate; the memory search uses the indexes.
(``python -m bench admin_scale`` measures the pages at a million rows.)"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import web.admin.lists
from agents.models import LLMCall, ToolInvocation
from examples.booking.workflow import FLIGHT_BOOKING
from memory.models import Memory
from memory.services import memory_create
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import checkpoint_record, session_create
from tests.world import make_agent

pytestmark = pytest.mark.django_db

LOG_LISTS = [
    "admin:chat_sessions_turn_changelist",
    "admin:chat_sessions_checkpoint_changelist",
    "admin:agents_llmcall_changelist",
    "admin:agents_toolinvocation_changelist",
    "admin:memory_memory_changelist",
]


@pytest.fixture
def logged(alice: Any) -> ChatSession:
    """A session with a few rows in every log."""
    chat_agent = make_agent(name="Chat", slug="chat", system_prompt="Be brief.")
    session = session_create(user=alice, agent=chat_agent)
    for seq in (1, 2, 3):
        turn = Turn.objects.create(
            session=session, seq=seq, user_message=f"message {seq}", assistant_message="ok", status="completed"
        )
        checkpoint_record(session=session, reason=Checkpoint.Reason.BEFORE_CALL, turn=turn)
        LLMCall.objects.create(
            agent=chat_agent, session=session, turn=turn, purpose="reply", provider="demo", model="m", outcome="ok"
        )
        ToolInvocation.objects.create(session=session, turn=turn, name="search_flights", ok=seq != 2)
        memory_create(user=alice, kind="episodic", text=f"User: message {seq}")
    return session


def _page(client: Client, name: str, params: dict[str, Any] | None = None) -> tuple[str, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(reverse(name), params or {})
    assert response.status_code == 200, response.content.decode()[:500]
    return response.content.decode(), [q["sql"] for q in ctx.captured_queries]


@pytest.mark.parametrize("name", LOG_LISTS)
def test_a_log_page_reads_no_distinct_values_and_no_dates_and_counts_once(
    staff_client: Client, logged: ChatSession, name: str
) -> None:
    for params in ({}, {"created_at__gte": "2000-01-01 00:00:00+00:00"}):  # unfiltered, and filtered
        _, queries = _page(staff_client, name, params)
        assert not [q for q in queries if "DISTINCT" in q.upper()], name
        assert not [q for q in queries if "DATE_TRUNC" in q.upper()], name
        counts = [q for q in queries if "COUNT(" in q.upper()]
        assert len(counts) <= 1, (name, params, counts)


def test_filters_offer_the_values_the_code_knows(staff_client: Client, logged: ChatSession) -> None:
    page, _ = _page(staff_client, "admin:chat_sessions_checkpoint_changelist")
    # Every state of every registered workflow, though no checkpoint of this log is in most of them.
    assert all(f"?state={state}" in page for state in FLIGHT_BOOKING.states)
    page, _ = _page(staff_client, "admin:chat_sessions_checkpoint_changelist", {"state": "GATHERING_ORIGIN"})
    assert "0 checkpoints" in page
    page, _ = _page(staff_client, "admin:agents_toolinvocation_changelist", {"ok__exact": "0"})
    assert "1 tool invocation" in page
    page, _ = _page(staff_client, "admin:agents_llmcall_changelist")
    assert "?outcome=rate_limited" in page and "?purpose=extract" in page and "?provider=openai" in page


def test_the_unfiltered_count_of_a_big_table_is_the_planners_estimate(
    staff_client: Client, logged: ChatSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE chat_sessions_turn")  # the estimate: 3 rows
    for seq in (4, 5):
        Turn.objects.create(session=logged, seq=seq, user_message="later", status="completed")
    monkeypatch.setattr(web.admin.lists, "ESTIMATE_COUNT_ABOVE", 2)  # 3 rows count as a big table here

    page, queries = _page(staff_client, "admin:chat_sessions_turn_changelist")
    assert "3 turns" in page and not [q for q in queries if "COUNT(" in q.upper()]
    # Any filter counts exactly.
    page, _ = _page(staff_client, "admin:chat_sessions_turn_changelist", {"status__exact": "completed"})
    assert "5 turns" in page

    monkeypatch.setattr(web.admin.lists, "ESTIMATE_COUNT_ABOVE", 100)  # a small table: exact
    page, _ = _page(staff_client, "admin:chat_sessions_turn_changelist")
    assert "5 turns" in page


def test_memory_search_by_words_username_and_fact_key_best_match_first(
    staff_client: Client, alice: Any, bob: Any
) -> None:
    weak = memory_create(user=bob, kind="episodic", text="User: the garden needs water, and the roses too")
    strong = memory_create(user=bob, kind="episodic", text="User: garden roses, roses, roses: my garden of roses")
    fact = memory_create(user=alice, kind="semantic", text="The user lives in Porto.", fact_key="home_city")
    name = "admin:memory_memory_changelist"

    def row(memory: Memory) -> str:
        return f'href="{reverse("admin:memory_memory_change", args=[memory.pk])}'  # then its filters

    page, queries = _page(staff_client, name, {"q": "rose gardens"})  # stemmed: roses, garden
    assert page.index(row(strong)) < page.index(row(weak)) and row(fact) not in page
    # The full-text index, not a LIKE over every text (procedures' triggers are read with LIKE: a handful).
    assert not [q for q in queries if "LIKE" in q.upper() and '"memory_memory"."text"' in q]

    page, _ = _page(staff_client, name, {"q": alice.username.upper()})
    assert row(fact) in page and row(strong) not in page
    page, _ = _page(staff_client, name, {"q": "home_city"})
    assert row(fact) in page and row(weak) not in page
    procedure = memory_create(
        user=None, kind="procedural", text="Offer store credit first.", trigger="refund, chargeback"
    )
    page, _ = _page(staff_client, name, {"q": "chargeback"})
    assert row(procedure) in page and row(fact) not in page
    assert Memory.objects.count() == 4
