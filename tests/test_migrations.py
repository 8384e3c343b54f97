"""Migrations that change indexes on the busy tables, applied both ways on a real database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

TABLES = ("agents_llmcall", "chat_sessions_chatsession", "chat_sessions_turn", "chat_sessions_checkpoint")
BEFORE = [("agents", "0002_initial"), ("chat_sessions", "0004_memory_write_pending_index")]


def _indexes() -> dict[str, str]:
    """index name -> definition, on the four tables."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ANY(%s)", [list(TABLES)])
        return dict(cursor.fetchall())


def _by_column(indexes: dict[str, str]) -> dict[str, list[str]]:
    """'table(column ...)' -> index names: which indexes exist for which column lists."""
    out: dict[str, list[str]] = {}
    for name, definition in indexes.items():
        table = definition.split(" ON public.")[1].split(" ")[0]
        columns = definition[definition.index("(") + 1 : definition.rindex(")")]
        out.setdefault(f"{table}({columns})", []).append(name)
    return out


def _migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


@pytest.fixture
def back_to_latest() -> Iterator[None]:
    yield
    executor = MigrationExecutor(connection)
    _migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_covered_field_indexes_are_dropped_and_come_back_on_reverse(back_to_latest: None) -> None:
    now = _indexes()
    columns = _by_column(now)
    # Covered by a composite index leading with the column: no index of their own.
    for single in (
        "chat_sessions_turn(session_id)",
        "chat_sessions_turn(status)",
        "chat_sessions_checkpoint(session_id)",
        "chat_sessions_chatsession(user_id)",
        "agents_llmcall(agent_id)",
    ):
        assert single not in columns, single
    assert not [n for n in now if n.endswith("_like")], "no LIKE index on enum columns"
    # Kept as plain, named btrees; the composites still there.
    assert columns["chat_sessions_chatsession(status)"] == ["session_status"]
    assert columns["agents_llmcall(purpose)"] == ["llmcall_purpose"]
    assert columns["agents_llmcall(outcome)"] == ["llmcall_outcome"]
    assert "turn_stuck_sweep" in now and "turn_seq_unique" in now and "llmcall_agent_time" in now

    _migrate(BEFORE)
    before = _indexes()
    columns = _by_column(before)
    assert "chat_sessions_turn(session_id)" in columns and "agents_llmcall(agent_id)" in columns
    assert "chat_sessions_chatsession(status varchar_pattern_ops)" in columns
    assert not {"session_status", "llmcall_purpose", "llmcall_outcome"} & set(before)

    _migrate([("agents", "0003_llmcall_fewer_indexes"), ("chat_sessions", "0005_fewer_indexes")])
    assert _indexes() == {name: d for name, d in now.items() if name not in LATER_INDEXES}


# Added by later migrations (chat_sessions 0011: branches), so not there at 0005.
LATER_INDEXES = {"session_user_branches", "session_parent", "session_forked_from"}
