"""The version-checked write of a session's row (optimistic concurrency).

Every state write is a compare-and-set on ``ChatSession.version``: the writer updates the row only if the
version it read is still there, and bumps it. A writer holding an outdated copy gets ``StaleSessionError``
instead of silently overwriting someone else's change (an operator's reset while a turn was running, say).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from core.db import update_sql
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services.checkpoints import CHECKPOINT_COLUMNS, checkpoint_from_row, checkpoint_insert_sql


class StaleSessionError(Exception):
    """The session changed since this copy was read (its version moved on); reload and decide again."""

    def __init__(self, session: ChatSession) -> None:
        super().__init__(
            f"session {session.pk} changed since it was read (version {session.version} is outdated); "
            "reload it and try again"
        )
        self.session_id = session.pk
        self.expected_version = session.version


def _mirror(session: ChatSession, fields: dict[str, Any], *, version: int, now: datetime) -> None:
    """Set on the instance what a compare-and-set wrote to its row: ``fields``, the new version, the time."""
    for name, value in fields.items():
        setattr(session, name, value)
    session.version = version
    session.updated_at = now


def compare_and_set(session: ChatSession, **fields: Any) -> None:
    """Write ``fields`` only if the row still has ``session.version``; bump it; mirror it on the instance."""
    expected = session.version
    now = timezone.now()
    updated = ChatSession.objects.filter(pk=session.pk, version=expected).update(
        **fields, version=expected + 1, updated_at=now
    )
    if updated != 1:
        raise StaleSessionError(session)
    _mirror(session, fields, version=expected + 1, now=now)


def compare_and_set_with_checkpoint(
    session: ChatSession, fields: dict[str, Any], *, reason: str, turn: Turn | None, transition: str, detail: str
) -> Checkpoint:
    """``compare_and_set`` and ``checkpoint_record`` in one statement: the row written only if it still has
    ``session.version``, and its checkpoint taken from the row as written. ``StaleSessionError`` when the version
    moved; an ``IntegrityError`` (``checkpoint_number_taken``), and nothing written, when another writer took the
    checkpoint's number while this statement waited for the row."""
    expected = session.version
    now = timezone.now()
    update, update_params = update_sql(
        ChatSession.objects.filter(pk=session.pk, version=expected), **fields, version=expected + 1, updated_at=now
    )
    sql = (
        f"WITH u AS ({update} RETURNING id, state, data, retry_count), c AS ("
        f"{checkpoint_insert_sql('u')} RETURNING {', '.join(CHECKPOINT_COLUMNS)})"
        f" SELECT (SELECT count(*) FROM u), {', '.join('c.' + c for c in CHECKPOINT_COLUMNS)}"
        " FROM (SELECT 1) AS one LEFT JOIN c ON true"
    )
    params = [*update_params, turn.pk if turn is not None else None, transition[:140], reason, detail, now]
    with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if not row or not row[0]:
        raise StaleSessionError(session)
    _mirror(session, fields, version=expected + 1, now=now)
    return checkpoint_from_row(row[1:])
