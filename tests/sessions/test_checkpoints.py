"""Checkpoint retention: the policy, the management command, and the periodic task on a real worker."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from agents.models import Agent
from conftest import WorkerHandle, wait_for
from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Checkpoint
from sessions.selectors import PRUNE_KEEP_REASONS
from sessions.services import checkpoint_before_call, checkpoints_prune, session_create, session_fork
from tests.world import make_agent


def _session_with_log(user: Any, reasons: list[str], slug: str = "pruner") -> ChatSession:
    agent = Agent.objects.filter(slug=slug).first() or make_agent(
        name="P", slug=slug, system_prompt="p", workflow="flight_booking"
    )
    session = session_create(user=user, agent=agent)
    Checkpoint.objects.bulk_create(
        Checkpoint(session=session, seq=i, state="IDLE", reason=reason) for i, reason in enumerate(reasons, start=1)
    )
    return session


@pytest.mark.django_db
def test_prune_keeps_the_newest_n_and_every_state_change(alice: Any) -> None:
    reasons = ["before_call", "transition", "before_call", "retry", "reset", "before_call", "invalid_transition"] * 3
    session = _session_with_log(alice, reasons)
    small = _session_with_log(alice, ["before_call"] * 3)
    expected_gone = [i for i, r in enumerate(reasons, start=1) if i <= len(reasons) - 5 and r not in PRUNE_KEEP_REASONS]
    assert checkpoints_prune(keep_last=5, dry_run=True) == len(expected_gone)
    assert Checkpoint.objects.filter(session=session).count() == len(reasons)  # a dry run deletes nothing
    progress: list[tuple[int, int, int]] = []
    deleted = checkpoints_prune(keep_last=5, on_progress=lambda *p: progress.append(p))
    assert deleted == len(expected_gone) and progress == [(1, 1, deleted)]
    left = list(Checkpoint.objects.filter(session=session).order_by("seq").values_list("seq", "reason"))
    assert [seq for seq, _ in left][-5:] == list(range(len(reasons) - 4, len(reasons) + 1))
    assert all(seq not in expected_gone for seq, _ in left)
    assert {r for _, r in left[:-5]} <= set(PRUNE_KEEP_REASONS)
    assert Checkpoint.objects.filter(session=small).count() == 3  # under the limit: untouched
    assert checkpoints_prune(keep_last=5) == 0  # idempotent


@pytest.mark.django_db
def test_prune_command_reports_and_honours_dry_run(alice: Any, settings: Any) -> None:
    settings.CHECKPOINT_KEEP_LAST = 2
    session = _session_with_log(alice, ["before_call"] * 6)
    out = StringIO()
    call_command("prune_checkpoints", "--dry-run", stdout=out)
    assert "would delete 4 checkpoint(s)" in out.getvalue()
    assert Checkpoint.objects.filter(session=session).count() == 6
    out = StringIO()
    call_command("prune_checkpoints", "--keep-last", "3", stdout=out)
    assert "deleted 3 checkpoint(s)" in out.getvalue()
    assert list(Checkpoint.objects.filter(session=session).values_list("seq", flat=True)) == [4, 5, 6]
    with pytest.raises(CommandError):
        call_command("prune_checkpoints", "--keep-last", "0", stdout=StringIO())


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_prune_task_runs_on_a_real_worker(celery_worker: WorkerHandle, alice: Any) -> None:
    from web.tasks.sessions import prune_checkpoints

    session = _session_with_log(alice, ["before_call"] * 8, slug="pruner-worker")
    prune_checkpoints.delay(4)
    wait_for(
        lambda: Checkpoint.objects.filter(session=session).count() == 4,
        timeout=30,
        message=f"the worker to prune checkpoints\n{celery_worker.log_text()[-2000:]}",
    )
    assert list(Checkpoint.objects.filter(session=session).values_list("seq", flat=True)) == [5, 6, 7, 8]


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_written_while_another_holds_the_session_row_takes_the_next_number(alice: Any) -> None:
    """``checkpoint_record`` is one statement (lock the row, read the state, number it); a checkpoint committed
    while it waited for the row lock is not in its snapshot, so it reads the last number again: no duplicate,
    no error, nothing lost."""
    import threading

    from django.db import connection, connections, transaction

    from sessions.services import checkpoint_record

    agent = make_agent(name="C", slug="c", system_prompt="x", workflow="free_chat")
    session = session_create(user=alice, agent=agent)
    first = Checkpoint.objects.filter(session=session).count()
    holding, waiting_started = threading.Event(), threading.Event()
    written: list[Checkpoint] = []

    def other_writer() -> None:
        try:
            with transaction.atomic():
                ChatSession.objects.select_for_update().get(pk=session.pk)
                holding.set()
                waiting_started.wait(10)
                # The other statement is queued on the row lock by now (it started after ``holding``).
                import time

                time.sleep(0.5)
                written.append(checkpoint_record(session=session, reason=Checkpoint.Reason.RESET, detail="other"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_writer)
    thread.start()
    assert holding.wait(10)
    waiting_started.set()
    mine = checkpoint_record(session=session, reason=Checkpoint.Reason.HANDOFF, detail="mine")
    thread.join(10)
    connection.close()
    seqs = list(Checkpoint.objects.filter(session=session).order_by("seq").values_list("seq", "detail"))
    assert [s for s, _ in seqs] == list(range(1, first + 3))
    assert written[0].seq == first + 1 and mine.seq == first + 2 and seqs[-1] == (first + 2, "mine")


@pytest.mark.django_db(transaction=True)
def test_a_transition_while_another_writer_numbers_a_checkpoint_is_written_whole(alice: Any) -> None:
    """The transition's write and its checkpoint are one statement; when another writer took the checkpoint's
    number while it waited for the row, neither is written, and both are written again in a transaction."""
    import threading
    import time

    from django.db import connections, transaction

    from agents.workflows import get_workflow
    from sessions.services import checkpoint_record, transition_apply

    agent = make_agent(name="B", slug="b", system_prompt="x", workflow="flight_booking", tools=["book_flight"])
    session = session_create(user=alice, agent=agent)
    workflow = get_workflow("flight_booking")
    decision = workflow.decision(next_state="GATHERING_DESTINATION", slots={"origin": "London"})
    holding = threading.Event()

    def other_writer() -> None:
        try:
            with transaction.atomic():
                ChatSession.objects.select_for_update().get(pk=session.pk)
                holding.set()
                time.sleep(0.5)  # the transition's statement is queued on the row lock meanwhile
                checkpoint_record(session=session, reason=Checkpoint.Reason.RESET, detail="other")
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_writer)
    thread.start()
    assert holding.wait(10)
    outcome = transition_apply(session=session, turn=None, decision=decision)
    thread.join(10)
    assert outcome.applied and outcome.checkpoint is not None
    session.refresh_from_db()
    assert session.state == "GATHERING_DESTINATION" and session.data["origin"] == "London"
    log = list(Checkpoint.objects.filter(session=session).order_by("seq").values_list("seq", "reason"))
    assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
    assert log[-2:] == [(log[-2][0], Checkpoint.Reason.RESET), (outcome.checkpoint.seq, Checkpoint.Reason.TRANSITION)]


@pytest.mark.django_db
def test_prune_keeps_what_a_branch_needs_every_turns_first_checkpoint_and_forked_from_ones(alice: Any) -> None:
    agent = make_agent(name="P", slug="pruner-branches", system_prompt="p", workflow="flight_booking")
    session = session_create(user=alice, agent=agent)
    for message in ("I need a flight", "From Madrid", "to Vienna"):
        turn_run(session=session, message=message)
    branch = session_fork(session=session, at_turn=3)
    # Later model calls of each turn (tools, continuations) take checkpoints of their own: those may go.
    turns = list(session.turns.order_by("seq"))
    for turn in turns * 4:
        checkpoint_before_call(session=session, turn=turn)
    starts = {turn.pk: turn.checkpoints.order_by("seq").first().pk for turn in turns}

    assert checkpoints_prune(keep_last=2) > 0
    kept = set(Checkpoint.objects.filter(session=session).values_list("pk", flat=True))
    assert set(starts.values()) <= kept
    branch.refresh_from_db()
    assert branch.forked_from_id in kept
    # Every turn can still be branched at, on the original and on the branch made from it.
    for seq, state in ((1, "IDLE"), (2, "GATHERING_ORIGIN"), (3, "GATHERING_DESTINATION")):
        assert Checkpoint.objects.get(pk=starts[turns[seq - 1].pk]).state == state
        assert session_fork(session=session, at_turn=seq).state == state
    assert session_fork(session=branch, at_turn=2).state == "GATHERING_ORIGIN"
