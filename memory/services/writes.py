"""The writes a door asks for directly (admin, API, MCP, an import): create (or find the same current memory),
edit, forget, and restore from an export. Each embeds its text synchronously, before its transaction, so the
user's lock is never held while a model runs; the one exception is an edit whose row changed between its read
and its lock (the new text is embedded then, under the lock).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec

from django.db import transaction
from django.utils import timezone

from core.db import refresh_from
from core.errors import Refusal
from memory.models import MEMORY_EDITABLE_FIELDS, Memory
from memory.selectors import own_memories
from memory.services.duplicates import content_hash_for, current_duplicate, duplicate_message, lock_user_memories
from memory.services.embed import embed_text, embed_texts

if TYPE_CHECKING:
    from agents.models import Agent
    from sessions.models import ChatSession, Turn

P = ParamSpec("P")

EDITABLE_FIELDS = frozenset(MEMORY_EDITABLE_FIELDS)


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
        vector, model_name = embed_text(text)
    else:
        vector, model_name = None, ""
    now = timezone.now()
    with transaction.atomic():
        lock_user_memories(getattr(user, "pk", None))
        existing = current_duplicate(user=user, kind=kind, text=text)
        if existing is None and vector is None:  # the duplicate went away meanwhile
            vector, model_name = embed_text(text)
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


class MemoryConflict(Refusal, ValueError):
    """An edit the memories as they are now refuse: onto another memory's text, or of a fact replaced meanwhile
    (the API's 409; a ValueError for the doors that show any refusal as one)."""

    code = "memory_conflict"
    status = 409


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
    embedded = embed_text(text) if text != memory.text else None
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
            embedded = embed_text(text)  # the caller's copy was stale: its text is the stored one's old text
        if text_changed and stored.valid_to is not None and memory.valid_to is None and "valid_to" not in fields:
            raise MemoryConflict("This fact was replaced by a newer one meanwhile; edit that one.")
        kind = fields.get("kind", stored.kind)
        if fields.get("valid_to", stored.valid_to) is None and {"text", "kind", "valid_to"} & set(fields):
            duplicate = current_duplicate(user=stored.user_id, kind=kind, text=text, exclude_id=stored.pk)
            if duplicate is not None:
                raise MemoryConflict(duplicate_message(duplicate))
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
    vectors, model_name = embed_texts([record["text"].strip() for _, record in todo])
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
                    source_turn=record.get("source_turn"),
                    embedding=vector,
                    embedding_model=model_name,
                    content_hash=record["content_hash"],
                    occurred_at=record.get("occurred_at") or now,
                    valid_from=record.get("valid_from") or now,
                    valid_to=record.get("valid_to"),
                )
            )
    return created, skipped
