"""The branch rule of recall (``turns_off_branch``, the database function retrieval reads) and the versions of a
turn, over a chat branched twice and a branch of a branch; another chat of the same person; another person."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent
from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Turn
from sessions.selectors import branch_lineage, branch_versions, turns_off_branch
from sessions.services import session_create, session_fork


def _chat(user: Any, agent: Agent, *messages: str, session: ChatSession | None = None) -> ChatSession:
    session = session or session_create(user=user, agent=agent)
    for message in messages:
        turn_run(session=session, message=message)
    return session


def _ids(session: ChatSession, *seqs: int) -> set[int]:
    return set(Turn.objects.filter(session=session, seq__in=seqs).values_list("pk", flat=True))


@pytest.mark.django_db
def test_the_branch_rule_over_branches_of_branches(alice: Any, bob: Any, chat_agent: Agent) -> None:
    root = _chat(alice, chat_agent, "a1", "a2", "a3")
    elsewhere = _chat(alice, chat_agent, "e1")
    bobs = _chat(bob, chat_agent, "b1")
    assert turns_off_branch(user_id=alice.pk, session_id=root.pk) == []  # never branched: nothing off

    b = _chat(alice, chat_agent, "b3", session=session_fork(session=root, at_turn=3))  # a1 a2 | b3
    c = _chat(alice, chat_agent, "c2", "c3", session=session_fork(session=b, at_turn=2))  # a1 | c2 c3
    assert branch_lineage(session=c) == [(c.pk, None), (b.pk, 2), (root.pk, 2)]

    # On c: a1 (its history), its own turns; not a2, a3 (root's, edited away), nor b's own b3 (a sibling's).
    off_c = set(turns_off_branch(user_id=alice.pk, session_id=c.pk))
    assert _ids(root, 2, 3) | _ids(b, 3) <= off_c
    assert not (_ids(root, 1) | _ids(c, 1, 2, 3)) & off_c
    # On the root: all of its own, none of the branches' own turns.
    off_root = set(turns_off_branch(user_id=alice.pk, session_id=root.pk))
    assert not _ids(root, 1, 2, 3) & off_root and _ids(b, 3) | _ids(c, 2, 3) <= off_root
    # Elsewhere, and with no session: only what a fork left behind (root's a3, edited on b; b's b3 and its copy of
    # a2, edited on c, and so root's a2 itself), never what is current (a1, c's turns).
    for session_id in (elsewhere.pk, None):
        off = set(turns_off_branch(user_id=alice.pk, session_id=session_id))
        assert off == _ids(root, 2, 3) | _ids(b, 2, 3)
    assert turns_off_branch(user_id=bob.pk, session_id=bobs.pk) == []  # another person: none of hers
    assert turns_off_branch(user_id=bob.pk, session_id=c.pk) == []  # her session's id gives him nothing

    # Versions: turn 2 has two (root's a2, c's c2); turn 3 on b has two (a3, b3); c's turn 3 has one.
    on_c = branch_versions(session=c)
    assert (on_c[2].index, on_c[2].total, on_c[2].sessions) == (2, 2, (root.pk, c.pk)) and 3 not in on_c
    on_b = branch_versions(session=b)
    assert (on_b[3].index, on_b[3].total) == (2, 2) and (on_b[2].index, on_b[2].total) == (1, 2)


@pytest.mark.django_db
def test_a_branch_keeps_the_summary_only_when_it_ends_before_the_fork(alice: Any, chat_agent: Agent) -> None:
    root = _chat(alice, chat_agent, "one", "two", "three", "four")
    ChatSession.objects.filter(pk=root.pk).update(
        summary="They said one and two.", summary_through_seq=2, summary_requested_seq=3
    )
    root.refresh_from_db()
    later = session_fork(session=root, at_turn=3)
    assert (later.summary, later.summary_through_seq, later.summary_requested_seq) == ("They said one and two.", 2, 2)
    # A fork at a turn the summary already folded in: the summary would tell of turns the branch does not have.
    earlier = session_fork(session=root, at_turn=2)
    assert (earlier.summary, earlier.summary_through_seq, earlier.summary_requested_seq) == ("", 0, 0)
    root.refresh_from_db()
    assert (root.summary, root.summary_through_seq) == ("They said one and two.", 2)  # the original as it was


@pytest.mark.django_db(transaction=True)
def test_forks_racing_messages_are_refused_or_whole_and_never_corrupt_either_branch(
    alice: Any, chat_agent: Agent
) -> None:
    import threading
    import time

    from django.db import connection

    from sessions.locks import SessionBusyError

    root = _chat(alice, chat_agent, "first")
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def talk() -> None:
        try:
            for i in range(4):
                turn_run(session=ChatSession.objects.get(pk=root.pk), message=f"message {i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    def fork() -> None:
        try:
            # While the messages are answered, and twice after (those go through).
            rounds = 0
            while talker.is_alive() or rounds < 2:
                rounds += 0 if talker.is_alive() else 1
                time.sleep(0.005)
                session = ChatSession.objects.get(pk=root.pk)
                last = Turn.objects.filter(session=session).order_by("-seq").values_list("seq", flat=True).first()
                try:
                    session_fork(session=session, at_turn=int(last or 1))
                    outcomes.append("forked")
                except SessionBusyError:
                    outcomes.append("busy")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    talker = threading.Thread(target=talk)
    threads = [talker, threading.Thread(target=fork)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert outcomes.count("forked") >= 2 and set(outcomes) <= {"forked", "busy"}
    source = list(Turn.objects.filter(session=root).order_by("seq").values_list("seq", "user_message", "status"))
    assert [seq for seq, _, _ in source] == list(range(1, 6)) and {s for _, _, s in source} == {"completed"}
    for branch in ChatSession.objects.filter(parent=root):
        copied = list(Turn.objects.filter(session=branch).order_by("seq").values_list("seq", "user_message", "status"))
        assert copied == source[: branch.fork_seq - 1]  # exactly the turns before its fork point, whole
        assert branch.forked_from is not None and branch.state == branch.forked_from.state
