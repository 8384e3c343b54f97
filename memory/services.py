"""Writes to memory: create and edit (embedding synchronously), turn writes (off the request path),
fact extraction with supersede / review, and the curation operations the admin offers.

Model calls (the embedder, the fact extractor) happen outside database transactions, so no lock is held
while a model runs; the one exception is an edit whose row changed between its read and its lock (the new
text is embedded then, under the user's lock).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, ParamSpec

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone
from pgvector.django import CosineDistance

from core.db import refresh_from, release_connection
from core.queue import enqueue, queued_args
from core.services import requeue_each
from llm.base import CallContext, LLMError
from llm.providers import get_provider
from memory.embedding import get_embedder
from memory.models import Memory, MemoryReview
from memory.schemas import ExtractedFacts, Fact
from memory.selectors import forget_user_indexes, own_memories, user_index_name, user_indexes_present
from sessions.models import Checkpoint, Turn

if TYPE_CHECKING:
    from agents.models import Agent
    from sessions.models import ChatSession, Turn

logger = logging.getLogger(__name__)
P = ParamSpec("P")

# Facts closer than this (cosine similarity) to a current fact of the same user are the same fact
# said differently: nothing is written.
NEAR_DUPLICATE_SIMILARITY = 0.92
EPISODE_IMPORTANCE = 0.3
FACT_IMPORTANCE = 0.7
EDITABLE_FIELDS = frozenset(
    {
        "text",
        "kind",
        "fact_key",
        "trigger",
        "workflow",
        "importance",
        "pinned",
        "archived",
        "needs_review",
        "valid_to",
        "expires_at",
        "occurred_at",
        "agent",
    }
)


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


def _embed(texts: list[str]) -> tuple[list[list[float]], str]:
    """The texts' vectors and the embedder's name. Outside a transaction this thread's database connection goes
    back first: a write waiting on a stalled embedder holds none (a worker's other tasks, and its heartbeat, need
    them)."""
    embedder = get_embedder()
    release_connection()
    return embedder.embed(texts), embedder.name


# pg_advisory_xact_lock(namespace, user): one writer of a user's facts and procedures at a time.
_USER_MEMORY_LOCK = 0x4D454D  # "MEM"


def lock_user_memories(user_id: int | None) -> None:
    """Serialize the writes of one user's memories until the end of the current transaction.

    The duplicate checks (one current row per text, one current fact per key) read before they insert;
    row locks cannot cover a row that does not exist yet, so two writers for one user (two turns' memory
    writes, an API edit and a write task) could both pass the check. Shared procedures (no user) use 0."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_USER_MEMORY_LOCK, int(user_id or 0) % (2**31)])


def memory_get_or_create(
    *,
    user: Any,
    kind: str,
    text: str,
    agent: Agent | None = None,
    importance: float = 0.5,
    pinned: bool = False,
    fact_key: str = "",
    trigger: str = "",
    workflow: str = "",
    source_session: ChatSession | None = None,
    source_turn: Turn | None = None,
    embedded: tuple[list[float], str] | None = None,
    occurred_at: datetime | None = None,
) -> tuple[Memory, bool]:
    """(the memory, True when it was created). Create a memory with its embedding (computed now,
    synchronously: for the admin and the API; or ``embedded``, the text's ``(vector, model name)`` computed by
    a caller that holds a transaction).

    ``user=None`` is allowed only for procedural memories shared by an agent or workflow. An identical
    current fact or procedure is returned instead of duplicated (restored first if it was archived: it is
    asked for again); a semantic fact with a ``fact_key`` supersedes the user's other current facts with
    that key (they get ``valid_to``), the restored one included. ``occurred_at`` is when what it tells
    happened (default: now); a duplicate keeps its own.
    """
    text = text.strip()
    if not text:
        raise ValueError("a memory needs text")
    if user is None and kind != Memory.Kind.PROCEDURAL:
        raise ValueError("only procedural memories may be shared (no user)")
    digest = content_hash_for(text)
    # The embedding first, outside the transaction: the user's lock is never held while a model runs.
    vector: list[float] | None
    if embedded is not None:
        vector, model_name = embedded
    elif current_duplicate(user=user, kind=kind, text=text) is None:
        vector, model_name = _embed_one(text)
    else:
        vector, model_name = None, ""
    now = timezone.now()
    with transaction.atomic():
        lock_user_memories(getattr(user, "pk", None))
        existing = current_duplicate(user=user, kind=kind, text=text)
        if existing is None and vector is None:  # the duplicate went away meanwhile
            vector, model_name = _embed_one(text)
        if kind == Memory.Kind.SEMANTIC and fact_key:
            others = Memory.objects.filter(user=user, kind=kind, fact_key=fact_key, valid_to__isnull=True)
            if existing is not None:
                others = others.exclude(pk=existing.pk)
            others.update(valid_to=now, updated_at=now)
        if existing is not None:
            changes: dict[str, Any] = {"archived": False, "updated_at": now}
            if kind == Memory.Kind.SEMANTIC and fact_key:
                changes["fact_key"] = fact_key
            Memory.objects.filter(pk=existing.pk).update(**changes)
            existing.refresh_from_db()
            return existing, False
        created = Memory.objects.create(
            user=user,
            agent=agent,
            kind=kind,
            text=text,
            fact_key=fact_key,
            trigger=trigger,
            workflow=workflow,
            importance=importance,
            pinned=pinned,
            source_session=source_session,
            source_turn=source_turn,
            embedding=vector,
            embedding_model=model_name,
            content_hash=digest,
            valid_from=now,
            occurred_at=occurred_at or now,
        )
        return created, True


def _memory_only(get_or_create: Callable[P, tuple[Memory, bool]]) -> Callable[P, Memory]:
    def memory_create(*args: P.args, **kwargs: P.kwargs) -> Memory:
        return get_or_create(*args, **kwargs)[0]

    memory_create.__doc__ = "``memory_get_or_create``, the memory alone: " + (get_or_create.__doc__ or "")
    return memory_create


memory_create = _memory_only(memory_get_or_create)


def _embed_one(text: str) -> tuple[list[float], str]:
    [vector], model_name = _embed([text])
    return vector, model_name


def memory_update(*, memory: Memory, **fields: Any) -> Memory:
    """Change a memory's editable fields; a new text gets a new content hash and a new embedding.

    Only the fields given are written, on the row as it is now (read again under the user's lock): an
    edit never writes back a stale copy's other fields (a fact superseded meanwhile stays superseded). A
    new text for a fact that is no longer in force is refused, as is an edit onto another memory's text."""
    unknown = set(fields) - EDITABLE_FIELDS
    if unknown:
        raise ValueError(f"not editable: {', '.join(sorted(unknown))}")
    text = fields["text"].strip() if "text" in fields else memory.text
    if not text:
        raise ValueError("a memory needs text")
    # Outside the transaction, as in memory_create (when the text differs from the caller's copy).
    embedded = _embed_one(text) if text != memory.text else None
    with transaction.atomic():
        lock_user_memories(memory.user_id)
        try:
            stored = Memory.objects.select_for_update().get(pk=memory.pk)
        except Memory.DoesNotExist:
            raise ValueError("This memory was deleted meanwhile.") from None
        if "text" not in fields:
            text = stored.text  # an edit of other fields keeps the text as it is now
        # Against the row as it is now, not the caller's copy: hash and vector always belong to the text.
        text_changed = text != stored.text
        if text_changed and embedded is None:
            embedded = _embed_one(text)  # the caller's copy was stale: its text is the stored one's old text
        if text_changed and stored.valid_to is not None and memory.valid_to is None and "valid_to" not in fields:
            raise ValueError("This fact was replaced by a newer one meanwhile; edit that one.")
        kind = fields.get("kind", stored.kind)
        if fields.get("valid_to", stored.valid_to) is None and {"text", "kind", "valid_to"} & set(fields):
            duplicate = current_duplicate(user=stored.user_id, kind=kind, text=text, exclude_id=stored.pk)
            if duplicate is not None:
                raise ValueError(duplicate_message(duplicate))
        changed = set(fields) - ({"text"} if not text_changed else set())
        for name, value in fields.items():
            if name != "text":
                setattr(stored, name, value)
        if text_changed and embedded is not None:
            stored.text = text
            stored.content_hash = content_hash_for(text)
            stored.embedding, stored.embedding_model = embedded
            changed |= {"content_hash", "embedding", "embedding_model"}
        stored.save(update_fields=sorted(changed | {"updated_at"}))
    refresh_from(memory, stored)
    return memory


def memory_forget(*, user: Any, memory_id: int) -> bool:
    """Delete ``user``'s memory ``memory_id`` for good; False when they have none by that id (someone else's
    as much as a missing one)."""
    return own_memories(user).filter(pk=memory_id).delete()[0] > 0


def memories_reembed(
    *,
    memories: Iterable[Memory],
    batch_size: int = 64,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Recompute embeddings with the current embedder (after a model change, or from the admin)."""
    embedder = get_embedder()
    done = 0
    batch: list[Memory] = []

    def flush() -> None:
        nonlocal done
        vectors = embedder.embed([m.text for m in batch])
        for memory, vector in zip(batch, vectors, strict=True):
            memory.embedding = vector
            memory.embedding_model = embedder.name
        Memory.objects.bulk_update(batch, ["embedding", "embedding_model"])
        done += len(batch)
        if on_progress is not None:
            on_progress(len(batch))
        batch.clear()

    for memory in memories:
        batch.append(memory)
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    return done


def memories_set_pinned(*, memories: QuerySet[Memory], pinned: bool) -> int:
    """Pin (always included for their user) or unpin memories."""
    return memories.update(pinned=pinned, updated_at=timezone.now())


def memories_set_archived(*, memories: QuerySet[Memory], archived: bool) -> int:
    """Archive (never retrieved again, kept for history) or restore memories."""
    return memories.update(archived=archived, updated_at=timezone.now())


def merge_plan(memories: Sequence[Memory]) -> tuple[Memory, list[Memory], str]:
    """What merging ``memories`` would do: the one kept, the ones archived, and the kept one's proposed text
    (each distinct text once, the kept one's first, one to a line: staff edit it into one statement before they
    confirm; run together, "User: I sail. User: my boat is Wren." read as one glued sentence). ``ValueError`` when they may not be merged: fewer than two,
    of different users, or of different kinds (an episode and a fact are not duplicates of each other)."""
    if len(memories) < 2:
        raise ValueError("select at least two memories to merge")
    if len({m.user_id for m in memories}) != 1:
        raise ValueError("memories of different users cannot be merged")
    kinds = sorted({m.kind for m in memories})
    if len(kinds) != 1:
        raise ValueError(f"memories of different kinds ({', '.join(kinds)}) cannot be merged: select one kind")
    if any(m.valid_to is not None for m in memories):
        raise ValueError("a fact that was replaced is history, not a duplicate: select memories in force")
    # The one kept is in force: an archived one is kept only when all are archived.
    ordered = sorted(memories, key=lambda m: (m.archived, not m.pinned, -m.importance, m.created_at, m.id))
    seen: set[str] = set()
    parts: list[str] = []
    for memory in ordered:
        text = " ".join(memory.text.split())
        key = text.lower().rstrip(".!? ")
        if text and key not in seen:
            seen.add(key)
            parts.append(text if text[-1] in ".!?" else text + ".")
    return ordered[0], ordered[1:], "\n".join(parts)


def memories_merge(*, memories: Sequence[Memory], text: str | None = None) -> Memory:
    """Merge duplicates of one user and one kind into one memory (``merge_plan``): the kept one takes ``text``
    (as staff edited it; else the plan's combined text), re-embedded, the highest importance, the pin and the
    access counts; the others are archived. All in one transaction. ``ValueError`` for an empty text."""
    keeper, others, planned = merge_plan(memories)
    text = planned if text is None else text.strip()
    if not text:
        raise ValueError("the merged memory needs text")
    with transaction.atomic():
        now = timezone.now()
        # Archived and closed: they are replaced by the kept one (closing also takes them out of the duplicate
        # check, so the kept one can take a text that one of them had).
        Memory.objects.filter(id__in=[m.id for m in others]).update(archived=True, valid_to=now, updated_at=now)
        keeper.importance = max(m.importance for m in memories)
        keeper.pinned = any(m.pinned for m in memories)
        keeper.access_count = sum(m.access_count for m in memories)
        keeper.save(update_fields=["importance", "pinned", "access_count", "updated_at"])
        if text != keeper.text:
            keeper = memory_update(memory=keeper, text=text)
    return keeper


def review_apply(*, review: MemoryReview, actor: Any = None) -> Memory:
    """Accept a queued contradicting fact: the old fact is closed, the proposed one becomes current."""
    now = timezone.now()
    # Embedded before the transaction: the review's and the user's locks are not held while a model runs.
    embedded = _embed_one(review.proposed_text.strip())
    # One transaction: the old fact is never closed without the new one in force, nor the review left pending.
    with transaction.atomic():
        # The user's lock first, as every writer takes it (before any row lock): else a turn's memory write
        # holding it and waiting for the old fact's row deadlocks with this holding the row.
        lock_user_memories(review.user_id)
        review = MemoryReview.objects.select_for_update().get(pk=review.pk)
        if review.status != MemoryReview.Status.PENDING:
            raise ValueError(f"review {review.pk} is already {review.status}")
        Memory.objects.filter(pk=review.existing_id, valid_to__isnull=True).update(
            valid_to=now, needs_review=False, updated_at=now
        )
        new = memory_create(
            user=review.user,
            kind=Memory.Kind.SEMANTIC,
            text=review.proposed_text,
            fact_key=review.proposed_key,
            importance=FACT_IMPORTANCE,
            source_session=review.source_session,
            source_turn=review.source_turn,
            embedded=embedded,
        )
        MemoryReview.objects.filter(pk=review.pk).update(
            status=MemoryReview.Status.APPLIED, resolved_at=now, resolved_by=actor
        )
    return new


def review_reject(*, review: MemoryReview, actor: Any = None) -> MemoryReview:
    """Discard a queued contradicting fact; the existing fact stays current."""
    now = timezone.now()
    with transaction.atomic():
        lock_user_memories(review.user_id)  # first, as in review_apply; a write may be queueing a review now
        review = MemoryReview.objects.select_for_update().get(pk=review.pk)
        if review.status != MemoryReview.Status.PENDING:
            raise ValueError(f"review {review.pk} is already {review.status}")
        review.status = MemoryReview.Status.REJECTED
        review.resolved_at = now
        review.resolved_by = actor
        review.save(update_fields=["status", "resolved_at", "resolved_by"])
        still_pending = MemoryReview.objects.filter(
            existing_id=review.existing_id, status=MemoryReview.Status.PENDING
        ).exists()
        if not still_pending:
            Memory.objects.filter(pk=review.existing_id).update(needs_review=False, updated_at=now)
    return review


# --- Turn writes (Celery) ------------------------------------------------------------------------


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


# The memory-write task (``web.tasks.memory.write_turn_memories``), sent by name: tasks are doors, above this.
WRITE_TASK = "memory.tasks.write_turn_memories"


def memory_writes_enqueue(*, turn: Turn) -> None:
    """Schedule the turn's memory writes for after the current transaction commits."""
    turn_id = turn.id
    transaction.on_commit(lambda: enqueue(WRITE_TASK, turn_id))


# The outbox sweep: a turn's write is enqueued after commit, straight to the broker. If the broker was
# down at that moment the enqueue failed (logged, the turn is saved) and nothing would ever retry it.
# The completed turn itself is the durable record of the pending write: the sweep finds turns whose
# write never ran and enqueues them again. Give the normal path this long before calling a write lost.
MEMORY_WRITES_LOST_AFTER = timedelta(minutes=5)
# How far back the sweep looks (bounds its query; older losses are left alone).
MEMORY_WRITES_LOOKBACK = timedelta(days=1)
# A write the sweep sent is not sent again before this long (core.services.requeue_claim): with the
# workers behind, it is still in the queue.
MEMORY_WRITES_REQUEUE_AGAIN_AFTER = timedelta(minutes=30)


def turns_with_lost_memory_writes(
    *, older_than: timedelta = MEMORY_WRITES_LOST_AFTER, lookback: timedelta = MEMORY_WRITES_LOOKBACK
) -> QuerySet[Turn]:
    """Completed turns whose memory write never committed: no ``memories_written_at``, and no episode.

    ``Turn.memories_written_at`` is set in the write's own transaction, so it is there exactly when the
    write committed: an episode a user deleted later is never written again, and a write that died after
    its model call (a soft time limit, retries run out) is found and sent again. Handoff turns and turns
    answered by a person (no agent reply) never get a write, so they are not lost ones.
    """
    now = timezone.now()
    return (
        Turn.objects.filter(
            status=Turn.Status.COMPLETED,
            completed_at__lte=now - older_than,
            completed_at__gte=now - lookback,
        )
        .exclude(assistant_message="")
        .filter(memories_written_at__isnull=True)
        .exclude(Exists(Memory.objects.filter(source_turn=OuterRef("pk"), kind=Memory.Kind.EPISODIC)))
        .exclude(Exists(Checkpoint.objects.filter(turn=OuterRef("pk"), reason=Checkpoint.Reason.HANDOFF)))
        .order_by("completed_at")
    )


def memory_writes_requeue(
    *,
    older_than: timedelta = MEMORY_WRITES_LOST_AFTER,
    lookback: timedelta = MEMORY_WRITES_LOOKBACK,
    limit: int = 500,
    again_after: timedelta = MEMORY_WRITES_REQUEUE_AGAIN_AFTER,
) -> int:
    """Enqueue again the memory writes that were lost (see ``turns_with_lost_memory_writes``).

    Safe to run any number of times: the write is idempotent (one episode per turn), and a write sent
    within ``again_after`` is not sent again (``requeue_claim``), so a backlog does not grow by a copy of
    every pending write per run. Returns how many were enqueued (at most ``limit``); stops at the first
    enqueue that fails (the broker is still down: the next run retries).
    """
    # Past the ones sent recently (still queued), up to ``limit`` more.
    turn_ids = list(
        turns_with_lost_memory_writes(older_than=older_than, lookback=lookback).values_list("pk", flat=True)[
            : limit * 4
        ]
    )
    # Writes still waiting in the queue (workers behind) are not lost: they are not sent again.
    queued = queued_args(WRITE_TASK) if turn_ids else None
    if queued:
        turn_ids = [turn_id for turn_id in turn_ids if (turn_id,) not in queued]
    sent = requeue_each(
        "memory-write",
        ((turn_id, partial(enqueue, WRITE_TASK, turn_id)) for turn_id in turn_ids),
        within=again_after,
        limit=limit,
    )
    if sent:
        logger.info("re-enqueued %s lost memory writes", sent)
    return sent


EXTRACTION_SYSTEM_PROMPT = (
    "You extract durable facts about the USER from one exchange of a conversation: their name, where they "
    "live, their home airport, their preferences, people and things they own or care about, plans with dates. "
    "Ignore small talk, questions, and anything the assistant said that the user did not confirm. "
    "Each fact is one short sentence about the user. Give a snake_case key for attributes that have one "
    "current value (name, home_city, home_airport, employer); reuse a known key when it fits; use an empty key "
    "for facts that can coexist. confidence is 1.0 for explicit statements, lower for guesses or hedges. "
    "Return an empty list when there is nothing durable."
)


def _extraction_messages(*, user_message: str, assistant_message: str, known_keys: list[str]) -> list[dict[str, Any]]:
    keys = ", ".join(known_keys) if known_keys else "(none yet)"
    return [
        {"role": "system", "content": EXTRACTION_SYSTEM_PROMPT},
        {
            "role": "user",
            "content": (
                f"Known fact keys for this user: {keys}\n\n"
                f"USER MESSAGE:\n{user_message}\n\nASSISTANT REPLY:\n{assistant_message}\n"
            ),
        },
    ]


def _extract_facts(*, turn: Turn, known_keys: list[str]) -> tuple[list[Fact], str]:
    session = turn.session
    provider = get_provider(agent=session.agent, cheap=True)
    messages = _extraction_messages(
        user_message=turn.user_message, assistant_message=turn.assistant_message, known_keys=known_keys
    )
    ctx = CallContext(purpose="extract", agent_id=session.agent_id, session_id=session.pk, turn_id=turn.id)
    try:
        extracted = provider.structured(messages, schema=ExtractedFacts, ctx=ctx, max_tokens=600)
    except LLMError as exc:
        # The episode is still written; losing this turn's facts beats retrying the whole write forever.
        logger.warning("fact extraction failed for turn %s: %s", turn.id, exc)
        return [], f"{type(exc).__name__}: {exc}"
    facts = [f for f in extracted.facts if f.text.strip()]
    return facts, ""


def _key_slug(key: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", key.strip().lower()).strip("_")[:80]


def _fact_apply(
    *,
    user: Any,
    agent: Any,
    fact: Fact,
    vector: list[float],
    model_name: str,
    turn: Turn,
    result: TurnMemoryWriteResult,
    now: Any,
) -> None:
    """Add, supersede, queue for review, or do nothing for one extracted fact (inside the write transaction)."""
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
    memory = Memory.objects.create(
        user=user,
        agent=agent,
        kind=Memory.Kind.SEMANTIC,
        text=text,
        fact_key=key,
        importance=FACT_IMPORTANCE,
        source_session=turn.session,
        source_turn=turn,
        embedding=vector,
        embedding_model=model_name,
        content_hash=digest,
        valid_from=now,
        occurred_at=turn.created_at or now,  # when the user said it
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
    facts, result.extraction_error = _extract_facts(turn=turn, known_keys=known_keys)
    text = episode_text(user_message=turn.user_message, assistant_message=turn.assistant_message)
    vectors, model_name = _embed([text] + [f.text.strip() for f in facts])
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
            result.episodic_id = _turn_episode_create(
                turn=turn, text=text, vector=vectors[0], model_name=model_name, now=now
            )
            # The memories this turn's prompt used get their access counted here, off the request path,
            # once (in the transaction that writes the episode, which a retry finds and skips).
            memories_touch(
                memory_ids=_retrieved_ids(turn),
                now=turn.started_at or turn.created_at or now,
                user_id=user.pk,
            )
            for fact, vector in zip(facts, vectors[1:], strict=True):
                _fact_apply(
                    user=user,
                    agent=turn.session.agent,
                    fact=fact,
                    vector=vector,
                    model_name=model_name,
                    turn=turn,
                    result=result,
                    now=now,
                )
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


def _turn_episode_create(*, turn: Turn, text: str, vector: list[float], model_name: str, now: datetime) -> int:
    """The turn's episodic memory (what was said, when it was said); returns its id."""
    session = turn.session
    episode = Memory.objects.create(
        user=session.user,
        agent=session.agent,
        kind=Memory.Kind.EPISODIC,
        text=text,
        importance=EPISODE_IMPORTANCE,
        source_session=session,
        source_turn=turn,
        embedding=vector,
        embedding_model=model_name,
        content_hash=content_hash_for(text),
        occurred_at=turn.created_at or now,  # when it was said; created_at is this row's own time
        valid_from=turn.created_at or now,
    )
    return int(episode.id)


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


# --- Per-user vector indexes ------------------------------------------------------------------------
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


def memories_restore(*, user: Any, records: Sequence[dict[str, Any]]) -> tuple[list[Memory], list[int]]:
    """Put back memories of ``user`` as they were exported (``people.portability``): text, kind, key,
    importance, pin, archive, when it happened and for how long it held. Embedded again here, all at once,
    before the transaction. One already there (same kind and text, in force or not alike) is skipped:
    importing twice writes once. Returns (created, indexes of the records skipped)."""
    todo: list[tuple[int, dict[str, Any]]] = []
    skipped: list[int] = []
    seen: set[tuple[str, str, bool]] = set()
    for index, record in enumerate(records):
        digest = content_hash_for(record["text"].strip())
        closed = record.get("valid_to") is not None
        key = (record["kind"], digest, closed)
        if (
            key in seen
            or Memory.objects.filter(
                user=user, kind=record["kind"], content_hash=digest, valid_to__isnull=not closed
            ).exists()
        ):
            skipped.append(index)  # there already, or twice in this file (texts alike but for case or spaces)
        else:
            seen.add(key)
            todo.append((index, {**record, "content_hash": digest}))
    if not todo:
        return [], skipped
    vectors, model_name = _embed([record["text"].strip() for _, record in todo])
    created: list[Memory] = []
    with transaction.atomic():
        lock_user_memories(user.pk)
        # A fact in force with a key replaces the user's current fact with that key, as a new one would.
        now = timezone.now()
        for _, record in todo:
            if record["kind"] == Memory.Kind.SEMANTIC and record.get("fact_key") and record.get("valid_to") is None:
                Memory.objects.filter(
                    user=user, kind=Memory.Kind.SEMANTIC, fact_key=record["fact_key"], valid_to__isnull=True
                ).update(valid_to=now, updated_at=now)
        for (_, record), vector in zip(todo, vectors, strict=True):
            now = timezone.now()
            created.append(
                Memory.objects.create(
                    user=user,
                    agent=record.get("agent"),
                    kind=record["kind"],
                    text=record["text"].strip(),
                    fact_key=record.get("fact_key", ""),
                    trigger=record.get("trigger", ""),
                    workflow=record.get("workflow", ""),
                    importance=record.get("importance", 0.5),
                    pinned=record.get("pinned", False),
                    archived=record.get("archived", False),
                    source_session=record.get("source_session"),
                    embedding=vector,
                    embedding_model=model_name,
                    content_hash=record["content_hash"],
                    occurred_at=record.get("occurred_at") or now,
                    valid_from=record.get("valid_from") or now,
                    valid_to=record.get("valid_to"),
                )
            )
    return created, skipped
