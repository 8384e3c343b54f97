"""Erasing a person: everything the app keeps about them, at once, and for good.

``person_erase`` deletes, in one transaction: their sessions (with turns, checkpoints and tool calls), the
model-call records of those sessions (their error texts can quote what was said), their memories and
review-queue items, and what each package plugged in through ``settings.PERSON_ERASERS`` keeps about them
(the booking example's bookings); it forgets what the cache holds for them (their rate counters), and
leaves an ``Erasure`` row saying who erased whom and when, with counts, and nothing of the content.

Work already queued for them finds nothing and writes nothing: the transaction takes the same per-user lock
as every memory write (``memory.services.lock_user_memories``) and each session's turn lock, and the
background tasks write only into rows that still exist (a turn, a session), checked under those locks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from agents.models import Erasure, LLMCall
from core import events
from core.plugins import load_plugins
from core.throttles import rate_counters_forget
from memory.models import Memory, MemoryReview
from memory.services import lock_user_memories
from sessions.locks import SessionBusyError, session_lease_take_in_transaction
from sessions.models import ChatSession, SessionLease, Turn

logger = logging.getLogger(__name__)

# A package's part of an erasure: ``eraser(user)`` deletes what the package keeps about ``user`` and returns how
# many of each it deleted, by name (``{"bookings": 2}``).
PersonEraser = Callable[[Any], dict[str, int]]
# Installable packages add erasers under this entry-point group (as a PERSON_ERASERS entry does).
PERSON_ERASERS_ENTRY_POINT_GROUP = "agents_runtime.person_erasers"


def configured_erasers() -> list[PersonEraser]:
    """The erasers of ``settings.PERSON_ERASERS`` (dotted paths to callables ``(user) -> dict[str, int]``), then
    those of installed packages' entry points; ``ImproperlyConfigured`` names an entry that cannot be imported
    or is not callable."""
    paths = getattr(settings, "PERSON_ERASERS", [])
    return load_plugins("PERSON_ERASERS", paths, PERSON_ERASERS_ENTRY_POINT_GROUP, _as_eraser)


def _as_eraser(value: object, source: str) -> list[PersonEraser]:
    if not callable(value):
        raise ImproperlyConfigured(f"{source} is {type(value).__name__}, not a callable (user) -> dict[str, int]")
    return [value]


def _erasers_run(erasers: list[PersonEraser], user: Any, counts: dict[str, int]) -> None:
    """Each eraser's counts, added to ``counts``; a result that is not counts by name stops the erasure (its
    transaction is rolled back), naming the eraser."""
    for eraser in erasers:
        got = eraser(user)
        if not isinstance(got, dict) or not all(
            isinstance(k, str) and isinstance(n, int) and not isinstance(n, bool) for k, n in got.items()
        ):
            name = f"{getattr(eraser, '__module__', '?')}.{getattr(eraser, '__qualname__', repr(eraser))}"
            raise TypeError(f"PERSON_ERASERS: {name} returned {got!r}, not a dict of counts by name")
        for key, n in got.items():
            counts[key] = counts.get(key, 0) + n


@dataclass
class ErasureResult:
    subject_id: int
    counts: dict[str, int] = field(default_factory=dict)
    erasure_id: int | None = None


def person_erase(*, user: Any, actor: Any = None) -> ErasureResult:
    """Erase everything kept about ``user`` (their account stays: they can go on using the app, from nothing).

    ``SessionBusyError`` when one of their sessions has a turn running: erasing under it would let it write
    its reply into rows that are gone, or recreate them; try again when it has finished."""
    result = ErasureResult(subject_id=user.pk)
    erasers = configured_erasers()  # a bad PERSON_ERASERS entry stops it before anything is deleted
    with transaction.atomic():
        lock_user_memories(user.pk)
        session_ids = list(ChatSession.objects.filter(user=user).values_list("pk", flat=True))
        for session_id in session_ids:
            if not session_lease_take_in_transaction(session_id):
                raise SessionBusyError(
                    "A message of this person is still being answered; erase again when it has finished."
                )
        # The admin's history names the objects it changed ("semantic: <the first words>"): theirs goes too.
        logged = [
            (ContentType.objects.get_for_model(ChatSession), [str(pk) for pk in session_ids]),
            (
                ContentType.objects.get_for_model(Memory),
                [str(pk) for pk in Memory.objects.filter(user=user).values_list("pk", flat=True)],
            ),
        ]
        admin_history = sum(
            LogEntry.objects.filter(content_type=kind, object_id__in=ids).delete()[0] for kind, ids in logged if ids
        )
        counts = {
            "admin_history": admin_history,
            "model_calls": LLMCall.objects.filter(session_id__in=session_ids).delete()[0],
            "reviews": MemoryReview.objects.filter(user=user).delete()[0],
            "memories": Memory.objects.filter(user=user).delete()[0],
        }
        # What packages keep about them (the booking example: "bookings"), while their sessions still exist.
        _erasers_run(erasers, user, counts)
        turn_ids = list(Turn.objects.filter(session_id__in=session_ids).values_list("pk", flat=True))
        deleted, by_model = ChatSession.objects.filter(pk__in=session_ids).delete()
        SessionLease.objects.filter(session_id__in=session_ids).delete()
        counts["sessions"] = by_model.get("chat_sessions.ChatSession", 0)
        counts["turns"] = by_model.get("chat_sessions.Turn", 0)
        counts["checkpoints"] = by_model.get("chat_sessions.Checkpoint", 0)
        counts["tool_calls"] = by_model.get("agents.ToolInvocation", 0)
        erasure = Erasure.objects.create(
            subject_id=user.pk, actor=actor if actor is not None and actor.pk else None, counts=counts
        )
        result.counts, result.erasure_id = counts, erasure.pk
    # What the broker holds for them: their turns' event streams (their words and the replies) and their sessions'
    # change signals.
    counts["event_streams"] = events.forget(runs=turn_ids, sessions=session_ids)
    Erasure.objects.filter(pk=result.erasure_id).update(counts=counts)
    # What the cache holds for them: the rate counters of the API and the chat (keyed by their id).
    rate_counters_forget(user.pk)
    logger.info("erased the data of user %s (by %s): %s", user.pk, getattr(actor, "pk", None), counts)
    return result


# What a person types to delete their account (the API's body and the account page's form).
ACCOUNT_DELETE_CONFIRMATION = "delete my account"


def account_delete(*, user: Any) -> ErasureResult:
    """A person deletes their account: everything kept about them is erased (``person_erase``), then the account
    itself, with its API tokens and sign-in sessions. The erasure's record stays, with the account's id and the
    counts (its actor, the account, becomes blank). ``SessionBusyError`` as ``person_erase``."""
    result = person_erase(user=user, actor=user)
    with transaction.atomic():
        user.delete()  # its tokens (authtoken) and admin log rows go with it; the Erasure row's actor is set null
    logger.info("deleted the account of user %s at their request", result.subject_id)
    return result
