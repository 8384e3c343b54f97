"""Plain reads of memory: one's own memories, those in force, and the per-user vector indexes that exist.

Retrieval (the tiered search every door uses) is ``memory.retrieval``; writes are ``memory.services``.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from memory.models import Memory


def current_q(now: datetime) -> Q:
    """Memories that are in force at ``now``: not archived, already valid, not superseded, not expired."""
    return (
        Q(archived=False)
        & Q(valid_from__lte=now)
        & (Q(valid_to__isnull=True) | Q(valid_to__gt=now))
        & (Q(expires_at__isnull=True) | Q(expires_at__gt=now))
    )


def own_memories(user: Any) -> QuerySet[Memory]:
    """Every memory of ``user``'s own, whatever its state (archived, superseded, expired included): what the
    API and MCP look ids up in, and what the API's ``?archived=true`` lists. Shared procedures are curated in
    the admin."""
    return Memory.objects.filter(user=user)


def memories_in_force(*, user: Any, now: datetime | None = None) -> QuerySet[Memory]:
    """``user``'s own memories in force (``current_q``: not archived, already valid, not superseded, not
    expired), newest first: what the API's memory list and MCP's ``list_memories`` list, as the admin's "in
    force" filter and the retriever see them."""
    at = now or timezone.now()
    return own_memories(user).filter(current_q(at)).order_by("-occurred_at", "-pk")


def memory_texts(*, user: Any, ids: list[int]) -> dict[int, str]:
    """Memory id -> full text, for those of ``ids`` that are ``user``'s own."""
    return dict(own_memories(user).filter(pk__in=ids).values_list("pk", "text"))


USER_INDEX_PREFIX = "memory_hnsw_user_"


def user_index_name(user_id: int) -> str:
    return f"{USER_INDEX_PREFIX}{int(user_id)}"


def user_indexes_present(*, valid: bool = True) -> dict[int, str]:
    """User id -> name of the per-user HNSW indexes that exist now (``valid=False``: those an interrupted
    build left unusable)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = 'memory_memory'::regclass AND i.indisvalid = %s AND c.relname LIKE %s",
            [valid, USER_INDEX_PREFIX + "%"],
        )
        names = [row[0] for row in cursor.fetchall()]
    return {int(name.removeprefix(USER_INDEX_PREFIX)): name for name in names}


# Users with an HNSW index of their own, as this process last read them (refreshed every minute). A
# user in it has a big history: no need to count it again on every query (the count walks up to the
# cap's worth of index entries). Stale for a minute at most, and harmlessly: a dropped index leaves the
# shared HNSW index, which answers the same query.
_OWN_INDEX_TTL = 60.0
_own_index_cache: tuple[float, frozenset[int]] = (0.0, frozenset())


def users_with_own_index() -> frozenset[int]:
    global _own_index_cache
    read_at, users = _own_index_cache
    if time.monotonic() - read_at > _OWN_INDEX_TTL:
        users = frozenset(user_indexes_present())
        _own_index_cache = (time.monotonic(), users)
    return users


def forget_user_indexes() -> None:
    """Read the per-user indexes again on next use (after creating or dropping some)."""
    global _own_index_cache
    _own_index_cache = (0.0, frozenset())
