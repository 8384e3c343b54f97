"""The round trips of a turn, pinned (``bench/turn_statements.py`` counts them; ``make bench`` reports them):
a change that adds statements to a chat, a decision or a tool turn fails here and is seen in review. When a
change removes some, lower the pins."""

from __future__ import annotations

from typing import Any

import pytest

from bench.turn_statements import count_turn_statements

# statements, transactions (COMMITs of atomic blocks)
PINNED = {"chat": (9, 0), "decision": (10, 0), "tool": (14, 1)}


@pytest.mark.django_db(transaction=True)
def test_the_statements_of_each_kind_of_turn_are_pinned(alice: Any) -> None:
    counts = count_turn_statements()
    found = {kind: (c.statements, c.transactions) for kind, c in counts.items()}
    report = "\n\n".join(f"{kind}:\n" + "\n".join(s[:160] for s in c.sql) for kind, c in counts.items())
    assert found == PINNED, f"{found}\n{report}"
