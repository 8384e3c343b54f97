"""``core.db.update_returning`` and ``refresh_from``: the turn's completion writes and reads back with them."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.db import refresh_from, update_returning
from sessions.models import ChatSession, Turn
from tests.world import make_agent


@pytest.fixture
def session(alice: Any, db: Any) -> ChatSession:
    agent = make_agent("chat")
    return ChatSession.objects.create(user=alice, agent=agent, workflow="free_chat", state="CHATTING", version=3)


def _fields(instance: Any) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


class TestUpdateReturning:
    def test_one_statement_returns_the_rows_as_a_read_would(self, session: ChatSession) -> None:
        when = timezone.now()
        with CaptureQueriesContext(connection) as ctx:
            rows = update_returning(
                ChatSession.objects.filter(pk=session.pk),
                version=F("version") + 1,
                data={"city": "Oslo", "n": [1, 2]},
                updated_at=when,
            )
        assert len(ctx.captured_queries) == 1
        assert "RETURNING" in ctx.captured_queries[0]["sql"]
        (row,) = rows
        assert row.version == 4
        # Converters ran: JSON comes back as objects, timestamps as aware datetimes, the id as a UUID.
        assert row.data == {"city": "Oslo", "n": [1, 2]}
        assert row.updated_at == when and row.updated_at.tzinfo is not None
        assert _fields(row) == _fields(ChatSession.objects.get(pk=session.pk))

    def test_every_matched_row_and_none_other(self, session: ChatSession) -> None:
        for seq in (1, 2, 3):
            Turn.objects.create(session=session, seq=seq, user_message=f"m{seq}", status=Turn.Status.RUNNING)
        rows = update_returning(Turn.objects.filter(session=session, seq__gte=2), status=Turn.Status.FAILED)
        assert sorted(r.seq for r in rows) == [2, 3]
        assert all(r.status == Turn.Status.FAILED for r in rows)
        assert Turn.objects.get(session=session, seq=1).status == Turn.Status.RUNNING

    def test_no_match_is_an_empty_list(self, session: ChatSession) -> None:
        assert update_returning(ChatSession.objects.filter(pk=session.pk, version=99), version=0) == []
        session.refresh_from_db()
        assert session.version == 3

    def test_needs_a_value(self, session: ChatSession) -> None:
        with pytest.raises(ValueError, match="at least one value"):
            update_returning(ChatSession.objects.filter(pk=session.pk))


class TestRefreshFrom:
    def test_copies_fields_and_keeps_an_unchanged_relation(self, session: ChatSession) -> None:
        held = ChatSession.objects.select_related("agent").get(pk=session.pk)
        agent = held.agent
        (fresh,) = update_returning(ChatSession.objects.filter(pk=session.pk), state="DONE", version=F("version") + 1)
        with CaptureQueriesContext(connection) as ctx:
            refresh_from(held, fresh)
            assert held.agent is agent  # still cached: same agent id
        assert len(ctx.captured_queries) == 0
        assert (held.state, held.version) == ("DONE", 4)

    def test_a_changed_relation_is_dropped(self, session: ChatSession) -> None:
        held = ChatSession.objects.select_related("agent").get(pk=session.pk)
        other = make_agent(name="Other", slug="other", system_prompt="x", workflow="free_chat")
        (fresh,) = update_returning(ChatSession.objects.filter(pk=session.pk), agent=other)
        refresh_from(held, fresh)
        assert held.agent_id == other.pk
        assert held.agent.slug == "other"  # read again, not the stale cached agent

    def test_refuses_another_row(self, session: ChatSession, alice: Any) -> None:
        other = ChatSession.objects.create(user=alice, agent=session.agent, workflow="free_chat", state="CHATTING")
        with pytest.raises(ValueError, match="same row"):
            refresh_from(session, other)


def test_storable_text_replaces_what_postgres_refuses() -> None:
    from core.text import storable_text

    assert storable_text("plain é ✓") == "plain é ✓"
    assert storable_text("a\x00b") == "a\ufffdb"
    assert storable_text("x\ud800y\udfffz") == "x\ufffdy\ufffdz"
    assert storable_text("🙂") == "🙂"  # a whole pair is a character, not a lone surrogate
    # The two halves of a pair, escaped apart ("\ud83d" "\ude42"), are the character; reversed, two lone ones.
    assert storable_text("a\ud83d\ude42b") == "a🙂b"
    assert storable_text("\ude42\ud83d") == "\ufffd\ufffd"


def test_hold_high_surrogate_keeps_a_first_half_for_the_next_piece() -> None:
    from core.text import hold_high_surrogate

    assert hold_high_surrogate("smile \ud83d") == ("smile ", "\ud83d")
    assert hold_high_surrogate("smile 🙂") == ("smile 🙂", "")
    assert hold_high_surrogate("lone \ude42") == ("lone \ude42", "")  # a second half waits for nothing
    assert hold_high_surrogate("") == ("", "")
