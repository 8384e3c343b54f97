"""A migration operation for the indexes Django makes for a field (``db_index=True``, every foreign key):
drop the ones a composite index already covers, without blocking writes to a live table."""

from __future__ import annotations

from typing import Any

from django.db import migrations


class DropFieldIndexes(migrations.RunPython):
    """Drop the index Django made for each ``(table, column, is_text)`` and, for a text column, its
    ``varchar_pattern_ops`` twin (for LIKE, which nothing runs on these columns). ``keep`` maps a column
    to the name of a plain btree index to keep on it instead: the old index is renamed (a catalog change),
    or built when it is missing.

    The names are the ones Django's schema editor gives, so every database this app migrated has them;
    one that lacks them is left as it is (IF EXISTS). Concurrently, so the migration needs ``atomic = False``.
    Reversible: the reverse builds Django's indexes again (concurrently) and drops the kept ones.
    State is changed by the ``AlterField`` / ``AddIndex`` operations it is paired with
    (``SeparateDatabaseAndState``)."""

    def __init__(self, columns: list[tuple[str, str, bool]], keep: dict[tuple[str, str], str] | None = None):
        self.columns = columns
        self.keep = keep or {}
        super().__init__(self._forwards, self._backwards, atomic=False, elidable=False)

    def _names(self, schema_editor: Any, table: str, column: str) -> tuple[str, str]:
        return (
            schema_editor._create_index_name(table, [column]),
            schema_editor._create_index_name(table, [column], suffix="_like"),
        )

    def _forwards(self, apps: Any, schema_editor: Any) -> None:
        q = schema_editor.quote_name
        for table, column, is_text in self.columns:
            plain, like = self._names(schema_editor, table, column)
            if is_text:
                schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(like)}")
            kept = self.keep.get((table, column))
            if kept:
                schema_editor.execute(f"ALTER INDEX IF EXISTS {q(plain)} RENAME TO {q(kept)}")
                schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(kept)} ON {q(table)} ({q(column)})")
            else:
                schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(plain)}")

    def _backwards(self, apps: Any, schema_editor: Any) -> None:
        q = schema_editor.quote_name
        for table, column, is_text in self.columns:
            plain, like = self._names(schema_editor, table, column)
            kept = self.keep.get((table, column))
            if kept:
                schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(kept)}")
            schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(plain)} ON {q(table)} ({q(column)})")
            if is_text:
                schema_editor.execute(
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(like)} ON {q(table)} ({q(column)} varchar_pattern_ops)"
                )
