"""Taking one's data out and bringing it in: JSON Lines with a versioned header.

An export is one person's sessions (with their workflow state), turns and memories (with their history:
facts that held before, archived ones, pins, kinds, when each happened), one JSON object a line after a
header line ``{"format": "agents-runtime-export", "version": 1, ...}``. Embeddings are not in it: the
importing side embeds again, with its own model.

An import reads and checks the whole file before it writes anything: a malformed line is refused with its
line number and nothing is written. Then it writes what is not there yet (sessions by id, turns by session
and number, memories by kind and text) and reports what it skipped and why; importing the same file twice
writes once. ``mem0_records`` reads Mem0's export (``get_all``'s ``{"results": [...]}``, a list, or JSON
Lines of memories), so people can move from it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from django.db import transaction
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agents.models import Agent
from agents.workflows import get_workflow
from core.incoming import INT_MAX, storable_value
from core.text import storable_text
from memory.models import Memory
from memory.services import memories_restore
from sessions.models import ChatSession, Turn

EXPORT_FORMAT = "agents-runtime-export"
EXPORT_VERSION = 1
MAX_LINE_CHARS = 1_000_000


class ImportRejected(ValueError):
    """The file cannot be imported; nothing was written. ``line`` is 1-based (0: the file as a whole)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.message = message


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @field_validator("*")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        # The rule every door shares: text without NUL or lone surrogates, dates that PostgreSQL and Python
        # both hold (a date PostgreSQL stores and Python cannot read back broke every list, the export and
        # the erasure of its owner).
        return storable_value(value)


class Header(_Record):
    format: Literal["agents-runtime-export"]
    version: int = Field(ge=1, le=EXPORT_VERSION)
    exported_at: datetime | None = None


class SessionRecord(_Record):
    type: Literal["session"]
    id: uuid.UUID
    agent: str
    title: str = Field(default="", max_length=200)
    workflow: str = Field(max_length=80)
    state: str = Field(max_length=60)
    data: dict[str, Any] = Field(default_factory=dict)
    status: Literal["active", "needs_human", "failed", "completed", "closed"] = "active"
    summary: str = ""
    summary_through_seq: int = Field(default=0, ge=0, le=INT_MAX)
    created_at: datetime | None = None
    # A branch of a chat (``sessions.services.session_fork``): the session it was made from, at which of its
    # turns, and the id the chat's branches share.
    parent: uuid.UUID | None = None
    fork_turn: int | None = Field(default=None, ge=1, le=INT_MAX)
    chat_root: uuid.UUID | None = None


class TurnRecord(_Record):
    type: Literal["turn"]
    session: uuid.UUID
    seq: int = Field(ge=1, le=INT_MAX)
    user_message: str
    assistant_message: str = ""
    status: Literal["completed", "failed"]
    state_before: str = Field(default="", max_length=60)
    state_after: str = Field(default="", max_length=60)
    created_at: datetime | None = None
    completed_at: datetime | None = None


class MemoryRecord(_Record):
    type: Literal["memory"]
    kind: Literal["episodic", "semantic", "procedural"]
    text: str = Field(min_length=1, max_length=20_000)
    fact_key: str = Field(default="", max_length=80)
    trigger: str = Field(default="", max_length=200)
    workflow: str = Field(default="", max_length=80)
    importance: float = Field(default=0.5, ge=0, le=1)
    pinned: bool = False
    archived: bool = False
    agent: str | None = None
    source_session: uuid.UUID | None = None
    # The turn (its seq in ``source_session``) it was said on: what the branch rule of recall reads.
    source_turn: int | None = Field(default=None, ge=1, le=INT_MAX)
    occurred_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None


RECORDS: dict[str, type[_Record]] = {"session": SessionRecord, "turn": TurnRecord, "memory": MemoryRecord}


# --- export ----------------------------------------------------------------------------------------------
def person_export(*, user: Any) -> Iterator[str]:
    """The lines of ``user``'s export (each ends with a newline), the header first."""
    header = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": timezone.now().isoformat(),
        "user": user.get_username(),
    }
    yield _line(header)
    sessions = ChatSession.objects.filter(user=user).select_related("agent").order_by("created_at", "pk")
    for session in sessions.iterator(chunk_size=200):
        yield _line(
            {
                "type": "session",
                "id": str(session.pk),
                "agent": session.agent.slug,
                "title": session.title,
                "workflow": session.workflow,
                "state": session.state,
                "data": session.data,
                "status": session.status,
                "summary": session.summary,
                "summary_through_seq": session.summary_through_seq,
                "created_at": session.created_at.isoformat(),
                "parent": str(session.parent_id) if session.parent_id else None,
                "fork_turn": session.fork_seq,
                "chat_root": str(session.chat_root) if session.chat_root else None,
            }
        )
        finished = session.turns.filter(status__in=(Turn.Status.COMPLETED, Turn.Status.FAILED)).order_by("seq")
        for turn in finished.iterator(chunk_size=500):
            yield _line(
                {
                    "type": "turn",
                    "session": str(session.pk),
                    "seq": turn.seq,
                    "user_message": turn.user_message,
                    "assistant_message": turn.assistant_message,
                    "status": turn.status,
                    "state_before": turn.state_before,
                    "state_after": turn.state_after,
                    "created_at": turn.created_at.isoformat(),
                    "completed_at": turn.completed_at.isoformat() if turn.completed_at else None,
                }
            )
    memories = Memory.objects.filter(user=user).select_related("agent", "source_turn").order_by("valid_from", "pk")
    for memory in memories.iterator(chunk_size=500):
        yield _line(
            {
                "type": "memory",
                "kind": memory.kind,
                "text": memory.text,
                "fact_key": memory.fact_key,
                "trigger": memory.trigger,
                "workflow": memory.workflow,
                "importance": memory.importance,
                "pinned": memory.pinned,
                "archived": memory.archived,
                "agent": memory.agent.slug if memory.agent else None,
                "source_session": str(memory.source_session_id) if memory.source_session_id else None,
                "source_turn": memory.source_turn.seq if memory.source_turn else None,
                "occurred_at": memory.occurred_at.isoformat(),
                "valid_from": memory.valid_from.isoformat(),
                "valid_to": memory.valid_to.isoformat() if memory.valid_to else None,
            }
        )


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, default=str) + "\n"


# --- reading ---------------------------------------------------------------------------------------------
@dataclass
class Parsed:
    sessions: list[tuple[int, SessionRecord]] = field(default_factory=list)
    turns: list[tuple[int, TurnRecord]] = field(default_factory=list)
    memories: list[tuple[int, MemoryRecord]] = field(default_factory=list)


def parse_export(lines: Iterable[str]) -> Parsed:
    """Every line checked before anything is written; ``ImportRejected`` names the first bad one."""
    parsed = Parsed()
    seen_header = False
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        if len(text) > MAX_LINE_CHARS:
            raise ImportRejected(number, f"the line is longer than {MAX_LINE_CHARS} characters")
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            raise ImportRejected(number, "not valid JSON") from None
        if not isinstance(obj, dict):
            raise ImportRejected(number, "expected a JSON object")
        if "\x00" in text or "\\u0000" in text:
            raise ImportRejected(number, "contains a NUL character")
        if not seen_header:
            try:
                Header.model_validate(obj)
            except ValidationError as exc:
                raise ImportRejected(
                    number,
                    f"the first line must be the header {{'format': '{EXPORT_FORMAT}', 'version': 1}}: {_why(exc)}",
                ) from None
            seen_header = True
            continue
        schema = RECORDS.get(str(obj.get("type")))
        if schema is None:
            raise ImportRejected(number, f"unknown record type {obj.get('type')!r} (session, turn or memory)")
        try:
            record = schema.model_validate(obj)
        except ValidationError as exc:
            raise ImportRejected(number, _why(exc)) from None
        if isinstance(record, SessionRecord):
            parsed.sessions.append((number, record))
        elif isinstance(record, TurnRecord):
            parsed.turns.append((number, record))
        elif isinstance(record, MemoryRecord):
            parsed.memories.append((number, record))
    if not seen_header:
        raise ImportRejected(0, "the file is empty")
    return parsed


def mem0_records(text: str) -> Parsed:
    """Mem0's export as memory records: ``{"results": [...]}``, a list, or JSON Lines, each with a ``memory``
    text (its ``created_at`` and ``metadata`` kept where they fit)."""
    items: list[tuple[int, Any]]
    try:
        whole = json.loads(text)
    except (ValueError, RecursionError):
        items = []
        for number, raw in enumerate(text.splitlines(), start=1):
            if raw.strip():
                try:
                    items.append((number, json.loads(raw)))
                except (ValueError, RecursionError):
                    raise ImportRejected(number, "not valid JSON") from None
    else:
        found = whole.get("results", whole.get("memories")) if isinstance(whole, dict) else whole
        if not isinstance(found, list):
            raise ImportRejected(0, 'expected Mem0\'s {"results": [...]} or a list of memories')
        items = list(enumerate(found, start=1))
    parsed = Parsed()
    for number, item in items:
        if not isinstance(item, dict) or not isinstance(item.get("memory"), str) or not item["memory"].strip():
            raise ImportRejected(number, 'expected a memory object with a "memory" text')
        metadata: dict[str, Any] = item["metadata"] if isinstance(item.get("metadata"), dict) else {}
        try:
            record = MemoryRecord(
                type="memory",
                kind="semantic",
                text=storable_text(item["memory"]),
                importance=float(metadata.get("importance", 0.5)),
                occurred_at=item.get("created_at"),
                valid_from=item.get("created_at"),
            )
        except (ValidationError, TypeError, ValueError) as exc:
            raise ImportRejected(number, _why(exc) if isinstance(exc, ValidationError) else str(exc)) from None
        parsed.memories.append((number, record))
    return parsed


def _safe_state(record: SessionRecord) -> tuple[str, dict[str, Any], str]:
    """The imported session's state, data and status as the workflow here allows them: a state it does not
    have, or an action state (which would run its tool at once), becomes its first state; slots are checked
    by the workflow's own rules and the invalid ones left out."""
    try:
        workflow = get_workflow(record.workflow)
    except (ImportError, LookupError, KeyError, ValueError):
        return record.state, {}, "active"
    state = record.state
    if state not in workflow.states or state in workflow.action_states:
        state = workflow.initial_state
    data, _refused = workflow.merge_slots({}, record.data)
    if state == workflow.initial_state:
        data = {}
    return state, data, record.status


def _why(exc: ValidationError) -> str:
    # pydantic words a validator's own refusal "Value error, <its message>": the message is what people need.
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(record)'}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()[:5]
    )


# --- writing ---------------------------------------------------------------------------------------------
@dataclass
class ImportReport:
    created: dict[str, int] = field(default_factory=lambda: {"sessions": 0, "turns": 0, "memories": 0})
    skipped: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"created": self.created, "skipped": self.skipped}


def person_import(*, user: Any, parsed: Parsed) -> ImportReport:
    """Write what ``parsed`` holds that is not there yet, for ``user``; report what was skipped and why."""
    report = ImportReport()
    agents = {a.slug: a for a in Agent.objects.all()}
    sessions: dict[uuid.UUID, ChatSession | None] = {}
    with transaction.atomic():
        for number, record in parsed.sessions:
            sessions[record.id] = _session_import(user, number, record, agents, report, sessions)
        for number, turn in parsed.turns:
            _turn_import(number, turn, sessions, report)
    # The memories in a transaction of their own, embedded just before it: sessions and turns are committed
    # first (an import cut short between the two is completed by running it again: it skips what is there).
    _memories_import(user, parsed, agents, sessions, report)
    return report


def _session_import(
    user: Any,
    number: int,
    record: SessionRecord,
    agents: dict[str, Agent],
    report: ImportReport,
    sessions: dict[uuid.UUID, ChatSession | None],
) -> ChatSession | None:
    """The session ``record`` names for ``user``: the one already there, or a new one; None when its agent is
    not here (its turns are left out too)."""
    existing = ChatSession.objects.filter(pk=record.id).first()
    new_id = record.id
    if existing is not None and existing.user_id != user.pk:
        # Someone else's session has that id (an export of theirs): this one gets an id of its own, the
        # same on every import of the file (so a second import finds it).
        new_id = uuid.uuid5(record.id, f"user:{user.pk}")
        existing = ChatSession.objects.filter(pk=new_id, user=user).first()
    if existing is not None:
        report.skipped.append({"line": number, "reason": "this session is already there"})
        return existing
    agent = agents.get(record.agent)
    if agent is None:
        report.skipped.append({"line": number, "reason": f"no agent {record.agent!r} here: session and turns left out"})
        return None
    state, data, status = _safe_state(record)
    # A branch keeps its place in its chat: its parent as imported (the file lists sessions oldest first), and the
    # chat's id moved as this session's id moved (another person's ids are never shared).
    parent = sessions.get(record.parent) if record.parent else None
    chat_root = record.chat_root
    if chat_root is not None and chat_root in sessions and sessions[chat_root] is not None:
        chat_root = sessions[chat_root].pk  # type: ignore[union-attr]
    elif chat_root is not None and new_id != record.id:
        chat_root = uuid.uuid5(chat_root, f"user:{user.pk}")
    session = ChatSession.objects.create(
        id=new_id,
        parent=parent,
        fork_seq=record.fork_turn if parent is not None else None,
        chat_root=chat_root,
        user=user,
        agent=agent,
        title=record.title,
        workflow=record.workflow,
        state=state,
        data=data,
        status=status,
        summary=record.summary,
        summary_through_seq=record.summary_through_seq,
    )
    if record.created_at:
        ChatSession.objects.filter(pk=session.pk).update(created_at=record.created_at)
    report.created["sessions"] += 1
    return session


def _turn_import(
    number: int, turn: TurnRecord, sessions: dict[uuid.UUID, ChatSession | None], report: ImportReport
) -> None:
    """Write ``turn`` in its session, unless the session was left out or already has a turn of that seq."""
    target = sessions.get(turn.session)
    if target is None:
        why = "its session was left out" if turn.session in sessions else "its session is not in the file"
        report.skipped.append({"line": number, "reason": why})
        return
    if Turn.objects.filter(session=target, seq=turn.seq).exists():
        report.skipped.append({"line": number, "reason": f"turn {turn.seq} of this session is already there"})
        return
    row = Turn.objects.create(
        session=target,
        seq=turn.seq,
        user_message=turn.user_message,
        assistant_message=turn.assistant_message,
        status=turn.status,
        state_before=turn.state_before,
        state_after=turn.state_after,
        completed_at=turn.completed_at,
        # Its memories come with the file: the memory-write sweep must not write them again.
        memories_written_at=timezone.now(),
    )
    if turn.created_at:
        Turn.objects.filter(pk=row.pk).update(created_at=turn.created_at)
    report.created["turns"] += 1


def _memories_import(
    user: Any,
    parsed: Parsed,
    agents: dict[str, Agent],
    sessions: dict[uuid.UUID, ChatSession | None],
    report: ImportReport,
) -> None:
    """Restore the file's memories (embedded, in a transaction of their own), tied to the imported sessions."""
    imported = [s.pk for s in sessions.values() if s is not None]
    turns = {(t.session_id, t.seq): t for t in Turn.objects.filter(session_id__in=imported)} if imported else {}
    records = []
    for _, memory in parsed.memories:
        source = sessions.get(memory.source_session) if memory.source_session else None
        records.append(
            {
                **memory.model_dump(exclude={"type", "agent", "source_session", "source_turn"}),
                "agent": agents.get(memory.agent) if memory.agent else None,
                "source_session": source,
                "source_turn": turns.get((source.pk, memory.source_turn)) if source and memory.source_turn else None,
            }
        )
    created, skipped = memories_restore(user=user, records=records)
    report.created["memories"] = len(created)
    for index in skipped:
        report.skipped.append({"line": parsed.memories[index][0], "reason": "this memory is already there"})
