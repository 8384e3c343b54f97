"""The access counter of memories that went into a prompt: one UPDATE, for recency and curation.

Its own module because both sides use it: the memory-write task counts a turn's retrieved memories
(``memory.services``), and a direct search counts what it returned (``memory.selectors``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import F, Q
from django.utils import timezone

from memory.models import Memory


def memories_touch(*, memory_ids: list[int], now: Any = None, user_id: int | None = None) -> int:
    """Count an access on memories that went into a prompt (one UPDATE, for recency and curation)."""
    if not memory_ids:
        return 0
    qs = Memory.objects.filter(id__in=memory_ids)
    if user_id is not None:
        qs = qs.filter(Q(user_id=user_id) | Q(user__isnull=True))
    return qs.update(access_count=F("access_count") + 1, last_accessed_at=now or timezone.now())
