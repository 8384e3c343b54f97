"""When a summary is due, and asking for it: the request after every turn and its outbox sweep.

``summary_request_if_due`` runs after every turn. It asks for a summary a little before turns leave the
sliding window (``SUMMARY_LEAD_TURNS``), in batches (``SUMMARY_BATCH_TURNS``), so the next call normally finds
it ready. A request is recorded (``summary_requested_seq``) before its task is sent; ``summaries_requeue``
sends again the requests whose task was lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core import task_names
from core.queue import enqueue
from core.services import requeue_each
from llm.prompt import ContextBudget, TurnText, window_size
from llm.tokens import TokenCounter, counter_for
from sessions.context import TurnHistory, turn_history
from sessions.models import ChatSession
from sessions.selectors import summaries_waiting


def _lead_turns() -> int:
    return int(getattr(settings, "SUMMARY_LEAD_TURNS", 2))


def _batch_turns() -> int:
    return int(getattr(settings, "SUMMARY_BATCH_TURNS", 2))


def summary_due(*, turns: Sequence[TurnText], budget: ContextBudget, counter: TokenCounter, through_seq: int) -> int:
    """The seq a summary should now reach, or 0 when none is due.

    ``turns`` are the newest completed turns, oldest first (``window_turns + SUMMARY_LEAD_TURNS + 1``
    of them suffice). The window is ``llm.prompt.window_size``. Due: turns that left the
    window, or will within ``SUMMARY_LEAD_TURNS`` turns, are not in the summary, and either
    ``SUMMARY_BATCH_TURNS`` of them have gathered or some have already left.
    """
    if not turns:
        return 0
    last = turns[-1].seq
    in_window = window_size(turns, budget=budget, counter=counter)
    left = turns[len(turns) - in_window].seq - 1 if in_window else last
    soon = _lead_turns()
    if in_window == len(turns) and in_window < budget.window_turns:
        # Nothing has left yet and the window has room: only the turns that overflow it leave soon.
        soon = max(0, in_window + soon - budget.window_turns)
    due = min(last, left + soon)
    if due <= through_seq or (due - through_seq < _batch_turns() and left <= through_seq):
        return 0
    return due


def checked_turns(budget: ContextBudget) -> int:
    """How many of the newest completed turns the summary trigger looks at."""
    return budget.window_turns + _lead_turns() + 1


def newest_turns(*, session: ChatSession, budget: ContextBudget) -> list[TurnText]:
    """The newest completed turns the window and the summary trigger look at, oldest first."""
    # More than the window (budget.window_turns), so the read stops at exactly this many.
    return turn_history(session=session, cap=checked_turns(budget)).newest


# The summary task (``web.tasks.sessions.summarize_session``), sent by name: tasks are doors, above this.
SUMMARY_TASK = task_names.SUMMARIZE_SESSION


def summary_request_if_due(
    *, session: ChatSession, history: TurnHistory | None = None, finished: TurnText | None = None
) -> bool:
    """Enqueue a summary of the turns leaving the window, unless they are folded in or already requested.

    See ``summary_due`` for when it is due. Returns whether a task was requested; it is sent
    after the current transaction commits (``web.tasks.sessions.summarize_session``). A caller that read the
    history for the turn that just finished (``history``, then ``finished`` completed) hands both over,
    and the newest turns are not read again.
    """
    budget = ContextBudget.from_agent(session.agent)
    turns = None
    if history is not None and finished is not None:
        turns = history.newest_with(finished, checked_turns(budget))
    due = summary_due(
        turns=turns if turns is not None else newest_turns(session=session, budget=budget),
        budget=budget,
        counter=counter_for(session.agent.model),
        through_seq=session.summary_through_seq,
    )
    requested = session.summary_requested_seq
    if not due or due <= requested:
        # Not due, or this request was made already (as this copy of the session knows it).
        return False
    if requested > session.summary_through_seq and due - requested < _batch_turns():
        # A request is still in flight: one at a time. Each task is a model call, and a worker that lags
        # would otherwise get one per turn. A lost request is superseded once a batch more is due (or
        # sent again by the sweep, ``summaries_requeue``).
        return False
    # Compare-and-set, so two turns finishing together request once; a lost task is superseded by
    # the next request, whose seq is higher.
    updated = ChatSession.objects.filter(pk=session.pk, summary_requested_seq__lt=due).update(summary_requested_seq=due)
    if not updated:
        return False
    session.summary_requested_seq = due
    session_id = str(session.pk)

    transaction.on_commit(lambda: enqueue(SUMMARY_TASK, session_id, due))
    return True


# A summary request is recorded (summary_requested_seq) before its task is sent. If the broker was down,
# the task was lost; a later turn supersedes it, but a session that goes quiet would stay unsummarized.
# The sweep sends requests that are still open after this long again (the task is idempotent).
SUMMARY_LOST_AFTER = timedelta(minutes=5)
SUMMARY_LOOKBACK = timedelta(days=1)
# A request the sweep sent is not sent again before this long (core.services.requeue_claim).
SUMMARY_REQUEUE_AGAIN_AFTER = timedelta(minutes=30)


def summaries_requeue(
    *,
    older_than: timedelta = SUMMARY_LOST_AFTER,
    lookback: timedelta = SUMMARY_LOOKBACK,
    limit: int = 500,
    again_after: timedelta = SUMMARY_REQUEUE_AGAIN_AFTER,
) -> int:
    """Enqueue again the summaries requested but not done after ``older_than`` (the outbox sweep).

    A request sent within ``again_after`` is not sent again (``requeue_claim``: with the workers behind
    it is still queued). Returns how many were sent (at most ``limit``); stops at the first failed
    enqueue (the broker is still down).
    """
    now = timezone.now()
    pending = (
        summaries_waiting()
        .filter(updated_at__lte=now - older_than, updated_at__gte=now - lookback)
        .order_by("updated_at")
        .values_list("pk", "summary_requested_seq")[: limit * 4]
    )
    return requeue_each(
        "summary",
        (
            (f"{session_id}:{through_seq}", partial(enqueue, SUMMARY_TASK, str(session_id), through_seq))
            for session_id, through_seq in pending
        ),
        within=again_after,
        limit=limit,
    )
