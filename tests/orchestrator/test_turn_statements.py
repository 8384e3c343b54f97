"""The round trips of a turn, pinned (``bench/turn_statements.py`` counts them; ``make bench`` reports them):
a change that adds statements to a chat, a decision or a tool turn fails here and is seen in review. When a
change removes some, lower the pins."""

from __future__ import annotations

from typing import Any

import pytest

from bench.turn_statements import count_turn_statements
from tests.world import make_agent

# statements, transactions (COMMITs of atomic blocks)
PINNED = {"chat": (9, 0), "decision": (10, 0), "tool": (14, 1)}


@pytest.mark.django_db(transaction=True)
def test_the_statements_of_each_kind_of_turn_are_pinned(alice: Any) -> None:
    counts = count_turn_statements()
    found = {kind: (c.statements, c.transactions) for kind, c in counts.items()}
    report = "\n\n".join(f"{kind}:\n" + "\n".join(s[:160] for s in c.sql) for kind, c in counts.items())
    assert found == PINNED, f"{found}\n{report}"


@pytest.mark.django_db
def test_the_turns_hand_written_session_read_matches_the_orms(alice: Any) -> None:
    """``session_for_turn`` reads the session, its agent and its user with SQL written once: every field
    (a JSON field's value parsed, a datetime aware) must be what the ORM reads, or a new field with a
    converter would reach the turn as raw text."""
    from sessions.models import ChatSession, Turn
    from sessions.selectors import session_for_turn, unfinished_turns

    agent = make_agent(
        name="A", slug="a", system_prompt="x", workflow="free_chat", tools=["search_flights"], relevance_threshold=0.2
    )
    session = ChatSession.objects.create(
        user=alice, agent=agent, workflow="free_chat", state="CHATTING", data={"k": [1]}
    )
    Turn.objects.create(session=session, seq=1, user_message="hi", status=Turn.Status.COMPLETED)
    Turn.objects.create(session=session, seq=2, user_message="again", status=Turn.Status.RUNNING)
    stale = ChatSession.objects.get(pk=session.pk)
    assert session_for_turn(session=stale) == (2, True)
    assert [t.seq for t in unfinished_turns(session=stale)] == [2]
    orm = ChatSession.objects.select_related("agent", "user").get(pk=session.pk)
    for mine, theirs in ((stale, orm), (stale.agent, orm.agent), (stale.user, orm.user)):
        for f in type(theirs)._meta.concrete_fields:
            got, want = getattr(mine, f.attname), getattr(theirs, f.attname)
            assert (got, type(got)) == (want, type(want)), f"{type(theirs).__name__}.{f.name}"
    assert not stale._state.adding
    Turn.objects.filter(seq=2).update(status=Turn.Status.COMPLETED)
    assert session_for_turn(session=stale) == (2, False)
    ChatSession.objects.filter(pk=session.pk).delete()
    with pytest.raises(ChatSession.DoesNotExist):
        session_for_turn(session=stale)
