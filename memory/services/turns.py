"""A turn's memory writes, off the request path (the Celery task): the episode, and each fact the extractor
found (added, superseding the same key, queued for review, or nothing); and the access count of the memories
a prompt used.

Model calls (the embedder, the fact extractor) happen before the write's transaction, so no lock is held while
a model runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone
from pgvector.django import CosineDistance

from core.db import release_connection
from memory.models import Memory, MemoryReview
from memory.schemas import Fact
from memory.services.duplicates import content_hash_for, current_duplicate, lock_user_memories
from memory.services.embed import embed_texts
from memory.services.extraction import extract_facts
from sessions.models import Turn

# Facts closer than this (cosine similarity) to a current fact of the same user are the same fact
# said differently: nothing is written.
NEAR_DUPLICATE_SIMILARITY = 0.92
EPISODE_IMPORTANCE = 0.3
FACT_IMPORTANCE = 0.7


@dataclass
class TurnMemoryWriteResult:
    turn_id: int
    written: bool  # False when an earlier run already wrote this turn (idempotency) or it was skipped
    episodic_id: int | None = None
    facts_added: list[int] = field(default_factory=list)
    facts_superseded: list[int] = field(default_factory=list)
    facts_unchanged: int = 0
    reviews: list[int] = field(default_factory=list)
    extraction_error: str = ""


def _key_slug(key: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", key.strip().lower()).strip("_")[:80]


def _fact_apply(
    *,
    fact: Fact,
    vector: list[float],
    model_name: str,
    turn: Turn,
    result: TurnMemoryWriteResult,
    now: Any,
) -> None:
    """Add, supersede, queue for review, or do nothing for one extracted fact (inside the write transaction)."""
    user = turn.session.user
    text = fact.text.strip()
    key = _key_slug(fact.key)
    digest = content_hash_for(text)
    current = Memory.objects.select_for_update().filter(
        Q(valid_to__isnull=True) | Q(valid_to__gt=now), user=user, kind=Memory.Kind.SEMANTIC, archived=False
    )
    if current.filter(content_hash=digest).exists():
        result.facts_unchanged += 1
        return
    if current_duplicate(user=user, kind=Memory.Kind.SEMANTIC, text=text) is not None:
        # Said before and archived by the user or an operator: their curation stands (and the database
        # allows one row per current text).
        result.facts_unchanged += 1
        return
    same_key = list(current.filter(fact_key=key)) if key else []
    if not same_key:
        nearest = (
            current.exclude(embedding__isnull=True)
            .annotate(distance=CosineDistance("embedding", vector))
            .order_by("distance")
            .first()
        )
        if nearest is not None and 1.0 - float(nearest.distance) >= NEAR_DUPLICATE_SIMILARITY:
            result.facts_unchanged += 1
            return
    if same_key and fact.confidence < settings.MEMORY_CONTRADICTION_CONFIDENCE:
        existing = same_key[0]
        if not MemoryReview.objects.filter(
            existing=existing, proposed_text=text, status=MemoryReview.Status.PENDING
        ).exists():
            review = MemoryReview.objects.create(
                user=user,
                existing=existing,
                proposed_text=text,
                proposed_key=key,
                confidence=fact.confidence,
                reason=f"contradicts current {key!r} fact with confidence {fact.confidence:.2f}",
                source_session=turn.session,
                source_turn=turn,
            )
            result.reviews.append(review.id)
        Memory.objects.filter(pk=existing.pk).update(needs_review=True)
        return
    for old in same_key:
        old.valid_to = now
        old.save(update_fields=["valid_to", "updated_at"])
        result.facts_superseded.append(old.id)
    memory = _turn_memory_create(
        turn=turn,
        kind=Memory.Kind.SEMANTIC,
        text=text,
        fact_key=key,
        importance=FACT_IMPORTANCE,
        vector=vector,
        model_name=model_name,
        valid_from=now,  # in force from this write on
        now=now,
    )
    result.facts_added.append(memory.id)


def episode_text(*, user_message: str, assistant_message: str) -> str:
    """The episodic memory of one turn: what the user said and what the agent answered."""
    reply = assistant_message.strip()
    if len(reply) > 1500:
        reply = reply[:1500] + " …"
    return f"User: {user_message.strip()}\nAssistant: {reply}" if reply else f"User: {user_message.strip()}"


def turn_memories_write(*, turn_id: int) -> TurnMemoryWriteResult:
    """Write one turn's memories: an episodic memory with its embedding, and the semantic facts extracted
    from it (add, supersede the same key, queue a low-confidence contradiction for review, or nothing).

    Idempotent: a second run for the same turn finds the episode and writes nothing. All rows are
    written in one transaction after the model calls, so a crash leaves either everything or nothing.
    """
    result = TurnMemoryWriteResult(turn_id=turn_id, written=False)
    turn = _turn_to_write(turn_id)
    if turn is None:
        return result
    user = turn.session.user
    known_keys = _known_fact_keys(user)
    release_connection()  # the extraction asks a model: no connection held meanwhile
    facts, result.extraction_error = extract_facts(turn=turn, known_keys=known_keys)
    text = episode_text(user_message=turn.user_message, assistant_message=turn.assistant_message)
    vectors, model_name = embed_texts([text] + [f.text.strip() for f in facts])
    now = timezone.now()
    try:
        with transaction.atomic():
            # One writer of this user's memories at a time (see lock_user_memories): two turns stating the
            # same fact, or the same key, at once would both pass the duplicate checks below.
            lock_user_memories(user.pk)
            # The proof the write ran commits with the writes, or not at all (see turns_with_lost_memory_writes).
            # Set only where it is not yet: a copy of this task that committed while this one called the
            # model has written the turn (its episode may be deleted since; it stays so).
            if not Turn.objects.filter(pk=turn.pk, memories_written_at__isnull=True).update(memories_written_at=now):
                return result
            # The turn's episodic memory: what was said, in force from when it was said.
            episode = _turn_memory_create(
                turn=turn,
                kind=Memory.Kind.EPISODIC,
                text=text,
                importance=EPISODE_IMPORTANCE,
                vector=vectors[0],
                model_name=model_name,
                valid_from=turn.created_at or now,
                now=now,
            )
            result.episodic_id = int(episode.id)
            # The memories this turn's prompt used get their access counted here, off the request path,
            # once (in the transaction that writes the episode, which a retry finds and skips).
            memories_touch(
                memory_ids=_retrieved_ids(turn),
                now=turn.started_at or turn.created_at or now,
                user_id=user.pk,
            )
            for fact, vector in zip(facts, vectors[1:], strict=True):
                _fact_apply(fact=fact, vector=vector, model_name=model_name, turn=turn, result=result, now=now)
    except IntegrityError:
        # A concurrent run of this task committed first (one episode per turn): nothing more to do.
        if Memory.objects.filter(source_turn_id=turn_id, kind=Memory.Kind.EPISODIC).exists():
            return TurnMemoryWriteResult(turn_id=turn_id, written=False)
        raise
    result.written = True
    return result


def _turn_to_write(turn_id: int) -> Turn | None:
    """The turn, with its session and agent, when its memories are still to write: None when it is gone
    (its session, or its person erased, since it was queued), has no message, or was written before."""
    turn = Turn.objects.select_related("session", "session__agent").filter(pk=turn_id).first()
    if turn is None:  # deleted since it was queued (its session, or its person erased): nothing to write
        return None
    if not turn.user_message.strip():
        return None
    # Written before (the proof, set in the write's transaction; an episode a user deleted stays deleted).
    if turn.memories_written_at is not None:
        return None
    if Memory.objects.filter(source_turn_id=turn_id, kind=Memory.Kind.EPISODIC).exists():
        return None
    return turn


def _known_fact_keys(user: Any) -> list[str]:
    """The keys of the user's current facts (the extractor reuses them rather than invent synonyms)."""
    return sorted(
        set(
            Memory.objects.filter(user=user, kind=Memory.Kind.SEMANTIC, valid_to__isnull=True)
            .exclude(fact_key="")
            .values_list("fact_key", flat=True)
        )
    )


def _turn_memory_create(
    *,
    turn: Turn,
    kind: str,
    text: str,
    importance: float,
    vector: list[float],
    model_name: str,
    valid_from: datetime,
    now: datetime,
    fact_key: str = "",
) -> Memory:
    """A memory the turn's write adds (its episode, or a fact it stated): of the session's user and agent, from
    that session and turn, embedded with ``vector``, and telling what happened when the turn was said."""
    session = turn.session
    return Memory.objects.create(
        user=session.user,
        agent=session.agent,
        kind=kind,
        text=text,
        fact_key=fact_key,
        importance=importance,
        source_session=session,
        source_turn=turn,
        embedding=vector,
        embedding_model=model_name,
        content_hash=content_hash_for(text),
        occurred_at=turn.created_at or now,  # when it was said; created_at is this row's own time
        valid_from=valid_from,
    )


def memories_touch(*, memory_ids: list[int], now: Any = None, user_id: int | None = None) -> int:
    """Count an access on memories that went into a prompt (one UPDATE, for recency and curation): the
    memory-write task counts a turn's retrieved memories, and a direct search (``memory.retrieval``) what it
    returned."""
    if not memory_ids:
        return 0
    qs = Memory.objects.filter(id__in=memory_ids)
    if user_id is not None:
        qs = qs.filter(Q(user_id=user_id) | Q(user__isnull=True))
    return qs.update(access_count=F("access_count") + 1, last_accessed_at=now or timezone.now())


def _retrieved_ids(turn: Turn) -> list[int]:
    """Ids of the memories that went into a turn's prompt, from its retrieval report."""
    items = (turn.retrieval or {}).get("items", []) if isinstance(turn.retrieval, dict) else []
    return [int(i["id"]) for i in items if isinstance(i, dict) and isinstance(i.get("id"), int)]
