"""The duplicate rules every memory write keeps: the content hash (a fact's or procedure's duplicate key), the
user's current memory with a given text, and the per-user lock under which the checks and the inserts run."""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import connection

from memory.models import Memory


def content_hash_for(text: str) -> str:
    """Hash of the text with case and whitespace normalised: the duplicate key of facts and procedures."""
    normalised = " ".join(text.lower().split())
    return hashlib.sha256(normalised.encode()).hexdigest()


def current_duplicate(*, user: Any, kind: str, text: str, exclude_id: int | None = None) -> Memory | None:
    """The memory of ``user`` and ``kind`` still in force (no ``valid_to``) with the same text, archived or not.

    The unique constraint ``memory_current_unique_content`` allows one such row per text: facts and
    procedures, not episodes. An archived row counts (the constraint has no ``archived`` condition), so a
    second row with its text would be refused by the database."""
    if kind == Memory.Kind.EPISODIC:
        return None
    rows = Memory.objects.filter(user=user, kind=kind, content_hash=content_hash_for(text), valid_to__isnull=True)
    if exclude_id is not None:
        rows = rows.exclude(pk=exclude_id)
    return rows.first()


def duplicate_message(duplicate: Memory) -> str:
    state = "an archived memory (restore that one)" if duplicate.archived else "a current memory"
    return f"Memory #{duplicate.pk} has this text already: {state}."


# pg_advisory_xact_lock(namespace, user): one writer of a user's facts and procedures at a time.
_USER_MEMORY_LOCK = 0x4D454D  # "MEM"


def lock_user_memories(user_id: int | None) -> None:
    """Serialize the writes of one user's memories until the end of the current transaction.

    The duplicate checks (one current row per text, one current fact per key) read before they insert;
    row locks cannot cover a row that does not exist yet, so two writers for one user (two turns' memory
    writes, an API edit and a write task) could both pass the check. Shared procedures (no user) use 0."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_USER_MEMORY_LOCK, int(user_id or 0) % (2**31)])
