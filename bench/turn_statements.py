"""Statements and transactions per turn, counted with Django's query capture around ``turn_run`` on the demo
model: deterministic (no timing), so a change that adds round trips shows in review.

Three turns of a conversation that has already begun (two turns before the counted one, as a live chat):

- ``chat``: a free-chat turn (retrieval, history, the reply with its audit row, the saved turn);
- ``decision``: a booking turn whose workflow decision is applied (the decision call, the transition and its
  checkpoint, then the reply);
- ``tool``: the booking turn that books (the decision to book, the ``book_flight`` tool call and its audit
  row, the move to COMPLETED, the reply).

``count_turn_statements()`` needs a database with the app's tables (the bench's own, or a test's); it
creates a user and two agents and leaves them there. ``tests/orchestrator/test_turn_statements.py`` pins the counts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

TURN_KINDS = ("chat", "decision", "tool")


@dataclass(frozen=True)
class TurnStatements:
    statements: int
    transactions: int
    by_kind: dict[str, int]
    sql: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"statements": self.statements, "transactions": self.transactions, "by_kind": self.by_kind}


def _counted(run: Any) -> tuple[Any, TurnStatements]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        result = run()
    sql = [q["sql"] for q in captured.captured_queries]
    kinds = Counter(s.split(None, 1)[0].upper() for s in sql if s.strip())
    # A transaction ends in a COMMIT (Django's atomic blocks log theirs); every other statement runs alone,
    # in autocommit, and is a transaction of its own.
    in_blocks = kinds.get("COMMIT", 0)
    return result, TurnStatements(
        statements=len(sql),
        transactions=in_blocks,
        by_kind=dict(kinds.most_common()),
        sql=sql,
    )


def _say(day: date) -> str:
    return f"{day:%B} {day.day}, {day.year}"


def count_turn_statements(*, username: str = "statements-bench") -> dict[str, TurnStatements]:
    """The statements of a chat, a decision and a tool turn on the demo model (see the module's docstring)."""
    from django.contrib.auth import get_user_model

    from agents.models import Agent
    from llm.demo import DemoModel
    from llm.providers import provider_override
    from orchestrator.runtime import turn_run
    from sessions.services import session_create

    user, _ = get_user_model().objects.get_or_create(username=username)
    chat_agent, _ = Agent.objects.get_or_create(
        slug="statements-chat",
        defaults={"name": "Statements chat", "system_prompt": "Be brief.", "workflow": "free_chat", "tools": []},
    )
    booking_agent, _ = Agent.objects.get_or_create(
        slug="statements-booking",
        defaults={
            "name": "Statements booking",
            "system_prompt": "You book flights.",
            "workflow": "flight_booking",
            "tools": ["book_flight"],
        },
    )
    counts: dict[str, TurnStatements] = {}
    with provider_override(lambda _agent, _cheap: DemoModel()):
        chat = session_create(user=user, agent=chat_agent)
        for message in ("Which train goes to Porto?", "And back on Sunday?"):
            turn_run(session=chat, message=message)
        _, counts["chat"] = _counted(lambda: turn_run(session=chat, message="Are there trains at night?"))

        depart = date.today() + timedelta(days=40)
        booking = session_create(user=user, agent=booking_agent)
        for message in ("Hi, I'd like to book a flight", "From London"):
            turn_run(session=booking, message=message)
        result, counts["decision"] = _counted(lambda: turn_run(session=booking, message="to Paris"))
        assert result.turn.state_after != result.turn.state_before, "the decision turn should move the workflow"
        for message in (f"{_say(depart)} to {_say(depart + timedelta(days=5))}", "2 passengers"):
            turn_run(session=booking, message=message)
        result, counts["tool"] = _counted(lambda: turn_run(session=booking, message="yes, book it"))
        assert result.turn.state_after == "COMPLETED", f"the tool turn should book ({result.turn.state_after})"
    return counts
