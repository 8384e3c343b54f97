"""Per-user vector indexes: the HNSW index of its own that a big history gets, built and dropped by a daily sync."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection
from django.db.models import Count

from memory.models import Memory
from memory.selectors import forget_user_indexes, user_index_name, user_indexes_present

logger = logging.getLogger(__name__)

# A user with fewer than MEMORY_EXACT_SEARCH_MAX memories is searched exactly (memory.retrieval.vector). A bigger
# history gets an HNSW index of its own: a partial index (WHERE user_id = <id>) holds only that user's
# vectors, so the graph walk wastes no steps on other users' neighbours, which the filtered walk of the
# shared index does in proportion to how small the user's share of all rows is. The planner picks it by
# itself for queries with that user id (a literal: Django binds parameters on the client). Until the
# sync has made it, the shared HNSW index with its iterative scan serves the user.
USER_INDEX_BUILD_MEMORY = "512MB"  # maintenance_work_mem while building one (a 100k history's graph: ~200 MB)


@dataclass
class UserIndexSync:
    created: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)


def users_needing_own_index(*, minimum: int | None = None) -> dict[int, int]:
    """User id -> memory count, for users with at least ``minimum`` memories (default: the exact-search cap)."""
    minimum = int(settings.MEMORY_EXACT_SEARCH_MAX if minimum is None else minimum)
    rows = (
        Memory.objects.filter(user__isnull=False)
        .values("user_id")
        .annotate(n=Count("id"))
        .filter(n__gte=minimum)
        .values_list("user_id", "n")
    )
    return {int(user_id): int(n) for user_id, n in rows}


def user_indexes_sync(
    *,
    minimum: int | None = None,
    on_plan: Callable[[int], None] | None = None,
    on_index: Callable[[int], None] | None = None,
) -> UserIndexSync:
    """Create the per-user HNSW indexes big histories need, and drop those of users who no longer need one.

    ``on_plan(n)`` hears how many indexes will be built, before the first; ``on_index(user_id)``, each one
    built (a progress bar, say).

    Indexes are built and dropped CONCURRENTLY (no lock on writes; it cannot run in a transaction). A user
    is dropped only below half the threshold, so one hovering around it does not rebuild every day.
    An invalid index left by an interrupted build is dropped and built again.
    """
    if connection.in_atomic_block:
        raise RuntimeError("user_indexes_sync builds indexes CONCURRENTLY and cannot run inside a transaction")
    minimum = int(settings.MEMORY_EXACT_SEARCH_MAX if minimum is None else minimum)
    # One count of every history: those past the threshold get an index, those past half keep theirs.
    still_big = users_needing_own_index(minimum=max(1, minimum // 2))
    wanted = {user_id for user_id, count in still_big.items() if count >= minimum}
    present = user_indexes_present()
    result = UserIndexSync()
    with connection.cursor() as cursor:
        for invalid in user_indexes_present(valid=False).values():
            cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{invalid}"')
        # The graph of one big history fits in this much memory, which makes the build several times faster.
        cursor.execute("SET maintenance_work_mem = %s", [USER_INDEX_BUILD_MEMORY])
        cursor.execute("SET statement_timeout = 0")  # a build takes minutes for a big history
        result.kept = sorted(wanted & present.keys())
        to_build = sorted(wanted - present.keys())
        if on_plan is not None:
            on_plan(len(to_build))
        for user_id in to_build:
            cursor.execute(
                f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{user_index_name(user_id)}" ON memory_memory '
                "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64) "
                f"WHERE user_id = {int(user_id)}"
            )
            result.created.append(user_id)
            if on_index is not None:
                on_index(user_id)
        cursor.execute("RESET maintenance_work_mem")
        cursor.execute("RESET statement_timeout")
        for user_id, name in present.items():
            if user_id not in still_big:
                cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
                result.dropped.append(user_id)
    if result.created or result.dropped:
        forget_user_indexes()
        logger.info("per-user vector indexes: created %s, dropped %s", result.created, result.dropped)
    return result
