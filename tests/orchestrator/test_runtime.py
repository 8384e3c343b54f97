"""The turn loop: a full booking on the demo model, idempotency, serialisation, bad input, tools,
routing, the step limit, handoff and model failures."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from agents.models import Agent, LLMCall, ToolInvocation
from agents.routing import RouteDecision, route_message
from agents.services import default_agents_ensure
from agents.tools.faults import ALWAYS, inject_fault
from conftest import wait_for
from examples.booking.models import Booking
from llm.base import LLMServerError, ToolCallRequest
from llm.scripted import ScriptedProvider, ScriptedReply
from orchestrator.runtime import MessageRejected, TurnStream, turn_run, turn_stream
from sessions.locks import SessionBusyError, SessionTurnLock, TurnLockLost, session_is_locked
from sessions.models import ChatSession, Checkpoint, SessionLease, Turn
from sessions.services import session_create
from tests.world import make_agent


def _future(days: int) -> date:
    return date.today() + timedelta(days=days)


def _say(d: date) -> str:
    return d.strftime("%B %d %Y")


@pytest.fixture
def booking_agent(db: Any) -> Agent:
    default_agents_ensure()
    return Agent.objects.get(slug="flight-booking")


@pytest.fixture
def scripted(use_provider: Any) -> ScriptedProvider:
    """The remote model, scripted: every runtime call goes to it (the edge of the world)."""
    provider = ScriptedProvider()
    use_provider(provider)
    return provider


def booking_script(depart: date) -> list[str]:
    """The booking conversation, flying out on ``depart`` (fixed by the test once: a test that runs across
    midnight must not compare with a date computed on the other side of it)."""
    return [
        "Hi, I'd like to book a flight",
        "From London",
        "to Paris",
        f"{_say(depart)} to {_say(depart + timedelta(days=5))}",
        "2 passengers",
        "yes, book it",
    ]


@pytest.mark.django_db
def test_full_booking_on_the_demo_model(alice: Any, booking_agent: Agent) -> None:
    session = session_create(user=alice, agent=booking_agent)
    assert session.state == "IDLE"
    depart = _future(100)
    for message in booking_script(depart):
        result = turn_run(session=session, message=message)
        assert result.turn.status == Turn.Status.COMPLETED, result.turn.error
        assert result.is_demo
    session.refresh_from_db()
    assert session.state == "COMPLETED"
    assert session.status == ChatSession.Status.COMPLETED
    booking = Booking.objects.get(session=session)
    assert (booking.origin, booking.destination, booking.passengers) == ("London", "Paris", 2)
    assert booking.depart_date == depart
    assert session.data["booking_reference"] == booking.reference
    assert booking.reference in Turn.objects.filter(session=session).order_by("-seq").first().assistant_message  # type: ignore[union-attr]
    # A checkpoint before every model call of the turn loop: the k-th call of a turn started after at least k
    # checkpoints of that turn (one taken before the call, or the transition the call before it led to).
    calls = list(LLMCall.objects.filter(session=session).order_by("created_at"))
    assert calls
    for turn in Turn.objects.filter(session=session):
        marks = sorted(Checkpoint.objects.filter(turn=turn).values_list("created_at", flat=True))
        for k, call in enumerate((c for c in calls if c.turn_id == turn.pk), start=1):
            started = call.created_at - timedelta(milliseconds=call.latency_ms)
            assert sum(1 for m in marks if m <= started) >= k, (turn.seq, k, call.purpose)
    # Every turn's prompt composition is stored for the inspector.
    last = Turn.objects.filter(session=session).order_by("-seq").first()
    assert last is not None and last.composition["total"] <= last.composition["limit"]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_dates_are_never_asked_again_after_early_turns_leave_the_prompt(
    alice: Any, booking_agent: Agent, celery_worker: Any
) -> None:
    """The seed's death spiral: lost context makes the agent ask for the dates again. Not here.

    A real worker folds the turns that leave the 3-turn window into the summary, as in production.
    """
    booking_agent.window_turns = 3
    booking_agent.save()
    session = session_create(user=alice, agent=booking_agent)
    depart = _future(100)
    for message in booking_script(depart)[:4]:
        turn_run(session=session, message=message)
    dates_turn = Turn.objects.get(session=session, seq=4)
    for i in range(10):
        result = turn_run(session=session, message=f"By the way, chatting about the weather, remark number {i}.")
        assert "date" not in result.reply.lower(), result.reply
        wait_for(
            lambda: (
                ChatSession.objects.filter(pk=session.pk)
                .values_list("summary_through_seq", "summary_requested_seq")
                .get()[0]
                >= ChatSession.objects.filter(pk=session.pk).values_list("summary_requested_seq", flat=True).get()
            ),
            timeout=30,
            message=f"the summary task; worker log:\n{celery_worker.log_text()[-6000:]}",
        )
    session.refresh_from_db()
    assert session.state == "GATHERING_PASSENGERS"
    assert session.data["depart_date"] == depart.isoformat()
    assert session.summary_through_seq >= dates_turn.seq
    last = Turn.objects.get(pk=result.turn.pk)
    assert dates_turn.seq not in last.composition["turns"]["included"]  # the early turn left the prompt…
    assert last.composition["sections"]["workflow"] > 0  # …the collected data did not.
    # Let the worker finish this session's memory writes before the test database is flushed.
    from memory.models import Memory

    turns = Turn.objects.filter(session=session, status=Turn.Status.COMPLETED).count()
    wait_for(
        lambda: Memory.objects.filter(source_turn__session=session, kind=Memory.Kind.EPISODIC).count() >= turns,
        timeout=60,
        message="the memory writes",
    )


@pytest.mark.django_db
def test_a_refused_detail_is_explained_in_the_reply_on_the_demo_model(alice: Any, booking_agent: Agent) -> None:
    """A date in the past or 15 passengers were dropped without a word: the user saw the same question again."""
    session = session_create(user=alice, agent=booking_agent)
    turn_run(session=session, message="I want to fly from Oslo to Rome")
    session.refresh_from_db()
    assert session.state == "GATHERING_DATES"

    past = turn_run(session=session, message="on 2020-01-01")
    assert "I could not use that: depart date: 2020-01-01 is in the past." in past.reply
    assert "What dates" in past.reply
    session.refresh_from_db()
    assert session.state == "GATHERING_DATES" and "depart_date" not in session.data

    turn_run(session=session, message=f"on {_say(_future(30))}")
    too_many = turn_run(session=session, message="15 passengers")
    assert "I could not use that: passengers: at most 9." in too_many.reply
    fine = turn_run(session=session, message="2 passengers")
    assert "could not use" not in fine.reply
    session.refresh_from_db()
    assert session.state == "CONFIRMING"

    # "Yes, but for 15": not a yes to the trip as it stands. It was booked for 2, without a word.
    changed = turn_run(session=session, message="yes, but for 15 passengers")
    session.refresh_from_db()
    assert session.state == "CONFIRMING" and session.data["passengers"] == 2
    assert changed.reply.startswith("I could not use that: passengers: at most 9.")
    assert "Shall I book it?" in changed.reply and not Booking.objects.exists()


@pytest.mark.django_db
def test_a_refused_detail_reaches_the_reply_prompt(
    alice: Any, booking_agent: Agent, scripted: ScriptedProvider
) -> None:
    """With a real model the reply is the model's: the prompt tells it what was refused and why."""
    session = session_create(user=alice, agent=booking_agent)
    scripted.add(
        json.dumps({"next_state": "GATHERING_DESTINATION", "slots": {"origin": "Oslo"}, "confidence": 0.9}),
        "Where to?",
        json.dumps(
            {
                "next_state": "GATHERING_DATES",
                "slots": {"destination": "Oslo"},  # the same place: refused
                "confidence": 0.9,
            }
        ),
        "Sorry, that is where you start. Where to?",
    )
    turn_run(session=session, message="from Oslo")
    turn_run(session=session, message="to Oslo")
    system = scripted.requests[-1].messages[0]["content"]
    assert "NOT ACCEPTED from the user's last message: destination: origin and destination are the same place" in system
    assert "NOT ACCEPTED" not in scripted.requests[1].messages[0]["content"]  # the first reply had nothing refused


@pytest.mark.django_db
def test_idempotency_key_returns_the_first_reply(alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    first = turn_run(session=session, message="hello there", idempotency_key="key-1")
    again = turn_run(session=session, message="hello there", idempotency_key="key-1")
    assert again.replayed and not first.replayed
    assert again.turn.pk == first.turn.pk and again.reply == first.reply
    assert Turn.objects.filter(session=session).count() == 1


@pytest.mark.django_db
def test_a_retry_of_a_failed_turn_under_its_key_is_a_replay_not_a_second_run(
    alice: Any, chat_agent: Agent, scripted: ScriptedProvider
) -> None:
    """A key names one turn, failed or not. Running a failed turn again under its key called the model,
    then threw the reply away (the turn was finished already) and answered with the old failure."""
    session = session_create(user=alice, agent=chat_agent)
    scripted.add(LLMServerError("upstream 500"))
    first = turn_run(session=session, message="hello there", idempotency_key="key-1")
    assert first.turn.status == Turn.Status.FAILED and not first.replayed
    calls = LLMCall.objects.count()

    scripted.add("Hello!")  # would answer, were the model asked again
    again = turn_run(session=session, message="hello there", idempotency_key="key-1")
    assert again.replayed and again.turn.pk == first.turn.pk and again.turn.status == Turn.Status.FAILED
    assert again.reply == first.reply and LLMCall.objects.count() == calls and scripted.remaining == 1
    # A new key tries the message again.
    fresh = turn_run(session=session, message="hello there", idempotency_key="key-2")
    assert fresh.reply == "Hello!" and fresh.turn.status == Turn.Status.COMPLETED
    assert list(Turn.objects.filter(session=session).values_list("status", flat=True).order_by("seq")) == [
        Turn.Status.FAILED,
        Turn.Status.COMPLETED,
    ]


@pytest.mark.parametrize(
    ("message", "code", "status"),
    [
        ("", "empty_message", 400),
        ("   \n", "empty_message", 400),
        ("a\x00b", "nul_bytes", 400),
        ("x" * 40000, "message_too_long", 413),
    ],
)
@pytest.mark.django_db
def test_bad_messages_are_rejected_and_nothing_is_saved(
    alice: Any, chat_agent: Agent, message: str, code: str, status: int
) -> None:
    session = session_create(user=alice, agent=chat_agent)
    with pytest.raises(MessageRejected) as info:
        turn_run(session=session, message=message)
    assert (info.value.code, info.value.status) == (code, status)
    assert not Turn.objects.filter(session=session).exists()


@pytest.mark.django_db
def test_a_message_to_a_session_deleted_before_the_lock_is_refused_as_not_found(alice: Any, chat_agent: Agent) -> None:
    """The doors read the session, then the runtime takes its lock: a delete committed in between (it holds
    the lock to its commit) left the runtime reading a session that was gone, a 500 in both doors."""
    session = session_create(user=alice, agent=chat_agent)
    ChatSession.objects.filter(pk=session.pk).delete()  # the door's copy lives on

    with pytest.raises(MessageRejected) as info:
        turn_run(session=session, message="still there?")

    assert (info.value.code, info.value.status) == ("not_found", 404)
    assert not Turn.objects.filter(session_id=session.pk).exists()
    assert not session_is_locked(session.pk)  # the lease was let go
    assert not SessionLease.objects.filter(session_id=session.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_concurrent_turn_gets_busy_not_a_second_run(alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    holding, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        lock = SessionTurnLock(session.pk)
        assert lock.try_acquire()
        holding.set()
        release.wait(10)
        lock.release()
        connection.close()

    thread = threading.Thread(target=hold_lock)
    thread.start()
    assert holding.wait(10)
    try:
        with pytest.raises(SessionBusyError):
            turn_run(session=session, message="am I first?", wait_seconds=0.2)
        assert not Turn.objects.filter(session=session).exists()
    finally:
        release.set()
        thread.join()
    assert turn_run(session=session, message="now?").turn.status == Turn.Status.COMPLETED


@pytest.mark.django_db
def test_stream_yields_deltas_then_done(alice: Any, chat_agent: Agent) -> None:
    session = session_create(user=alice, agent=chat_agent)
    events = list(turn_stream(session=session, message="tell me something"))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "turn" and kinds[-1] == "done"
    deltas = "".join(e["text"] for e in events if e["type"] == "delta")
    assert len([k for k in kinds if k == "delta"]) > 1
    assert deltas == events[-1]["reply"]


@pytest.mark.django_db
def test_tool_failure_reaches_the_model_as_text_and_the_turn_completes(alice: Any, scripted: ScriptedProvider) -> None:
    agent = make_agent(name="T", slug="t", system_prompt="x", workflow="free_chat", tools=["search_flights"])
    session = session_create(user=alice, agent=agent)
    args = json.dumps({"origin": "Lisbon", "destination": "Oslo", "date": _future(30).isoformat()})
    scripted.add(
        RouteDecision(action="use_tools", reasoning="needs flights", confidence=0.9),
        ScriptedReply(tool_calls=[ToolCallRequest(id="c1", name="search_flights", arguments=args)]),
        "The flight search is unavailable right now; please try later.",
    )
    with inject_fault("search_flights", "http_400", times=ALWAYS):
        result = turn_run(session=session, message="flights Lisbon to Oslo?")
    assert result.turn.status == Turn.Status.COMPLETED
    tool_message = scripted.requests[-1].messages[-1]
    assert tool_message["role"] == "tool" and tool_message["content"].startswith("TOOL_ERROR:")
    assert ToolInvocation.objects.get(turn=result.turn).attempts == 1  # a 400 is not retried


@pytest.mark.parametrize("free_text", ["Search", "search for more information", "検索する"])
@pytest.mark.django_db
def test_free_text_routing_output_never_misroutes(alice: Any, scripted: ScriptedProvider, free_text: str) -> None:
    agent = make_agent(name="T", slug="t", system_prompt="x", workflow="free_chat", tools=["search_flights"])
    session = session_create(user=alice, agent=agent)
    scripted.add(free_text, free_text, "Here is my answer.")  # invalid, invalid after repair, then the reply
    result = turn_run(session=session, message="find me something")
    assert result.turn.composition["route"] == {
        "action": "answer",
        "confidence": 0.0,
        "reasoning": "no valid decision (invalid_output)",
        "source": "invalid_output",
        "path": "route_call",
    }
    assert scripted.requests[-1].tools is None  # the safe default offers no tools
    assert not ToolInvocation.objects.filter(session=session).exists()


@pytest.mark.django_db
def test_low_confidence_routing_takes_the_safe_default() -> None:
    from llm.base import CallContext

    provider = ScriptedProvider([RouteDecision(action="use_tools", reasoning="maybe", confidence=0.2)])
    outcome = route_message(
        provider=provider, message="hm", tool_names=["search_flights"], ctx=CallContext(purpose="route")
    )
    assert (outcome.action, outcome.source) == ("answer", "low_confidence")


@pytest.mark.parametrize("behaviour", ["error", "partial", "handoff"])
@pytest.mark.django_db
def test_step_limit_gives_the_configured_behaviour(alice: Any, scripted: ScriptedProvider, behaviour: str) -> None:
    agent = make_agent(
        name="T",
        slug="t",
        system_prompt="x",
        workflow="free_chat",
        tools=["search_flights"],
        step_limit=3,
        step_limit_behaviour=behaviour,
    )
    session = session_create(user=alice, agent=agent)
    args = json.dumps({"origin": "Lisbon", "destination": "Oslo", "date": _future(30).isoformat()})
    scripted.add(RouteDecision(action="use_tools", reasoning="loop", confidence=0.9))
    scripted._default = ScriptedReply(
        text="still looking", tool_calls=[ToolCallRequest(id="c", name="search_flights", arguments=args)]
    )
    result = turn_run(session=session, message="loop forever please")
    turn = result.turn
    session.refresh_from_db()
    assert turn.step_limit_hit
    assert len([r for r in scripted.requests if r.purpose == "reply"]) == 3
    if behaviour == "error":
        assert turn.status == Turn.Status.FAILED and "3 steps" in turn.assistant_message
        assert session.retry_count == 1
    elif behaviour == "partial":
        assert turn.status == Turn.Status.COMPLETED and "partial answer" in turn.assistant_message
        assert "still looking" in turn.assistant_message
    else:
        assert session.status == ChatSession.Status.NEEDS_HUMAN
        assert Checkpoint.objects.filter(session=session, reason=Checkpoint.Reason.HANDOFF).exists()


@pytest.mark.django_db
def test_model_failure_keeps_the_message_and_counts_a_retry(
    alice: Any, chat_agent: Agent, scripted: ScriptedProvider
) -> None:
    session = session_create(user=alice, agent=chat_agent)
    scripted.add(LLMServerError("upstream 503"))
    events = list(turn_stream(session=session, message="are you there?"))
    assert events[-1]["type"] == "error" and events[-1]["code"] == "llm_server_error"
    turn = Turn.objects.get(session=session)
    assert turn.user_message == "are you there?" and turn.status == Turn.Status.FAILED
    session.refresh_from_db()
    assert session.retry_count == 1
    scripted.add("Yes, I'm here.")
    assert turn_run(session=session, message="again?").reply == "Yes, I'm here."
    session.refresh_from_db()
    assert session.retry_count == 0


@pytest.mark.django_db
def test_handoff_session_waits_for_a_person(alice: Any, staff: Any, chat_agent: Agent) -> None:
    from orchestrator.runtime import handoff_reply, handoff_resume

    session = session_create(user=alice, agent=chat_agent)
    ChatSession.objects.filter(pk=session.pk).update(status=ChatSession.Status.NEEDS_HUMAN)
    result = turn_run(session=session, message="I want a human")
    assert result.reply == "" and not LLMCall.objects.filter(session=session).exists()
    handoff_reply(session=session, text="Hello, I'm Sam from support.", author=staff)
    result.turn.refresh_from_db()
    assert "Sam from support" in result.turn.assistant_message
    handoff_resume(session=session, actor=staff)
    session.refresh_from_db()
    assert session.status == ChatSession.Status.ACTIVE


@pytest.mark.django_db
def test_a_question_asked_while_a_person_had_the_chat_is_answered_when_it_is_handed_back(
    alice: Any, staff: Any, chat_agent: Agent
) -> None:
    """Issue 55: the question a user asked while a person had the chat, unanswered, was never answered after
    "Hand back to the agent". Answered now, once; a question a person did answer is not answered again."""
    from orchestrator.runtime import handoff_reply, handoff_request, handoff_resume

    session = session_create(user=alice, agent=chat_agent)
    assert handoff_request(session=session, actor=staff)
    waiting = turn_run(session=session, message="What is the baggage allowance?").turn
    assert waiting.status == "completed" and waiting.assistant_message == ""
    handoff_resume(session=session, actor=staff)
    waiting.refresh_from_db()
    assert waiting.status == "completed" and "baggage allowance" in waiting.assistant_message
    assert LLMCall.objects.filter(turn=waiting).exists()
    session.refresh_from_db()
    assert session.status == ChatSession.Status.ACTIVE
    # Answered by a person: handing back does not answer it a second time.
    assert handoff_request(session=session, actor=staff)
    answered = turn_run(session=session, message="And for a second bag?").turn
    handoff_reply(session=session, text="Two bags are fine.", author=staff)
    calls = LLMCall.objects.filter(turn=answered).count()
    handoff_resume(session=session, actor=staff)
    answered.refresh_from_db()
    assert LLMCall.objects.filter(turn=answered).count() == calls and "Two bags are fine." in answered.assistant_message
    handoff_resume(session=session, actor=staff)  # twice: nothing more
    assert Turn.objects.filter(session=session).count() == 2


@pytest.mark.django_db
def test_a_staff_reply_is_signed_with_a_name_never_the_username(
    alice: Any, staff: Any, chat_agent: Agent, settings: Any
) -> None:
    """Issue 36: users saw the staff member's username. The reply is signed with their full name, else with
    STAFF_REPLY_NAME ("Support"); the username stays in the reply for staff pages only."""
    from orchestrator.runtime import handoff_reply

    session = session_create(user=alice, agent=chat_agent)
    ChatSession.objects.filter(pk=session.pk).update(status=ChatSession.Status.NEEDS_HUMAN)
    turn_run(session=session, message="I want a human")
    turn = handoff_reply(session=session, text="Hello.", author=staff)
    assert turn.staff_replies[-1]["author"] == "Support" and turn.staff_replies[-1]["staff"] == "staff"
    assert "[Support (staff)] Hello." in turn.assistant_message
    settings.STAFF_REPLY_NAME = "The travel desk"
    assert handoff_reply(session=session, text="Hi.", author=staff).staff_replies[-1]["author"] == "The travel desk"
    staff.first_name, staff.last_name = "Sam", "Lee"
    turn = handoff_reply(session=session, text="Sam here.", author=staff)
    assert turn.staff_replies[-1]["author"] == "Sam Lee" and "[Sam Lee (staff)] Sam here." in turn.assistant_message
    assert "[staff (staff)]" not in turn.assistant_message


def _hold_in_another_connection(session_id: Any, holding: threading.Event, release: threading.Event) -> None:
    lock = SessionTurnLock(session_id)
    assert lock.try_acquire()
    holding.set()
    release.wait(10)
    lock.release()
    connection.close()


@contextlib.contextmanager
def _lock_held_elsewhere(session_id: Any) -> Iterator[None]:
    """The session's turn lock, held by another connection (a live runner) for the block."""
    holding, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_in_another_connection, args=(session_id, holding, release))
    holder.start()
    assert holding.wait(10)
    try:
        yield
    finally:
        release.set()
        holder.join(10)


@pytest.mark.django_db(transaction=True)
def test_a_lost_turn_lock_is_retaken_or_the_turn_stops_without_writing(alice: Any, chat_agent: Agent) -> None:
    """A runner stalled past its lease (a cut connection, a stopped process) finds out before it writes: it takes
    the lease again when nobody else did, and writes nothing when someone has."""
    from orchestrator.finish import complete_turn

    session = session_create(user=alice, agent=chat_agent)
    lock = SessionTurnLock(session.pk)
    assert lock.try_acquire() and lock.holds_or_retakes()
    SessionLease.objects.filter(session_id=session.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert lock.holds_or_retakes()  # ran out, and nobody else has it: taken again
    lock.release()

    handle = turn_stream(session=session, message="hello")  # saves the turn, holds the lock
    events = iter(handle)
    next(events)  # the "turn" event: the turn is running
    turn = Turn.objects.get(session=session)
    # Our lease runs out (the runner stalled) and a new runner takes it.
    SessionLease.objects.filter(session_id=session.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with _lock_held_elsewhere(session.pk):
        with pytest.raises(TurnLockLost):
            complete_turn(
                session, turn, reply="dup", steps=1, composition={}, retrieval={}, prompt_tokens=0, is_demo=True
            )
        rest = list(events)
    assert rest[-1]["type"] == "error" and rest[-1]["code"] == "turn_taken_over"
    turn.refresh_from_db()
    assert turn.assistant_message == "" and turn.status == Turn.Status.RUNNING  # left to the new owner


@pytest.mark.django_db(transaction=True)
def test_a_free_chat_turn_sends_a_bounded_number_of_sql_statements(
    alice: Any, chat_agent: Agent, use_provider: Any
) -> None:
    """A guard on the turn's overhead (``bench/turn_overhead.py`` measures its time): retrieval, history,
    checkpoint, audit record and save in a fixed number of statements, none of them a write to memories
    (access counts are written by the memory-write task, off the request path)."""
    from django.test.utils import CaptureQueriesContext

    from llm.demo import DemoModel
    from memory.services import memory_create

    model, no_filter = ScriptedProvider(default="ok"), DemoModel()
    use_provider(lambda _agent, cheap: no_filter if cheap else model)
    for i in range(6):
        memory_create(user=alice, kind="episodic", text=f"User: a note about trains and timetables, number {i}")
    session = session_create(user=alice, agent=chat_agent)
    for message in ("Which train to Porto?", "And back?"):
        turn_run(session=session, message=message)

    with CaptureQueriesContext(connection) as ctx:
        result = turn_run(session=session, message="Are there trains on Sundays?")

    assert result.reply == "ok" and result.turn.retrieval["items"], result.turn.retrieval
    statements = [q["sql"] for q in ctx.captured_queries]
    assert len(statements) <= 21, "\n".join(s[:120] for s in statements)
    # The history is read once: the prompt and the summary check after the turn share that read.
    history_reads = [s for s in statements if s.startswith('SELECT "chat_sessions_turn"."seq"')]
    assert len(history_reads) == 1, history_reads
    assert not [s for s in statements if s.startswith("UPDATE") and "memory_memory" in s]
    assert sum(1 for s in statements if s == "COMMIT") <= 2  # the message, then the reply


@pytest.mark.django_db
def test_a_finished_turn_hands_back_the_turn_and_session_as_stored(
    alice: Any, chat_agent: Agent, scripted: ScriptedProvider
) -> None:
    """The completion's writes return the rows (``UPDATE … RETURNING``) instead of reading them again:
    what the caller holds afterwards must be what the database holds, the failure-count reset included."""
    session = session_create(user=alice, agent=chat_agent)
    scripted.add("first")
    turn_run(session=session, message="hello")
    ChatSession.objects.filter(pk=session.pk).update(retry_count=2)  # a failure counted since
    version = ChatSession.objects.get(pk=session.pk).version
    scripted.add("second")
    result = turn_run(session=session, message="again")

    def fields(instance: Any) -> dict[str, Any]:
        return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}

    assert fields(result.turn) == fields(Turn.objects.get(pk=result.turn.pk))
    assert result.turn.status == Turn.Status.COMPLETED and result.turn.assistant_message == "second"
    assert result.turn.state_after == session.state == "CHATTING"
    assert fields(session) == fields(ChatSession.objects.get(pk=session.pk))
    assert (session.retry_count, session.version) == (0, version + 1)
    assert session.agent == chat_agent and session.user == alice


@pytest.mark.django_db
def test_a_replys_recorded_prompt_tokens_are_the_builders_count_of_what_was_sent(
    alice: Any, chat_agent: Agent, scripted: ScriptedProvider
) -> None:
    from agents.models import LLMCall
    from llm.tokens import counter_for

    session = session_create(user=alice, agent=chat_agent)
    for text in ("My name is Ana and I fly from Lisbon.", "What is my name?"):
        scripted.add(f"Noted: {text}")
        turn_run(session=session, message=text)

    # The scripted model reports no usage: the record takes the context builder's count, which must be
    # exactly what counting the sent messages gives.
    request = scripted.requests[-1]
    call = LLMCall.objects.filter(session_id=session.pk, purpose="reply").latest("id")
    counter = counter_for(scripted.model)
    # The tools sent count too (a free chat with no tools of its own is offered the hand-to-a-person tool).
    assert [t.name for t in request.tools or []] == ["hand_to_person"]
    counted = counter.count_messages(request.messages) + counter.count_tools(
        [t.as_openai() for t in request.tools or []]
    )
    assert call.prompt_tokens == counted == sum(call.prompt_sections.values())


class _GatedProvider(ScriptedProvider):
    """Answers on the thread called "runner-A" only once the test opens the gate; notes that thread's backend."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate, self.in_call = threading.Event(), threading.Event()
        self.backend_pid: int | None = None

    def _open_stream(self, messages: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "runner-A":
            self.backend_pid = connection.connection.info.backend_pid
            self.in_call.set()
            assert self.gate.wait(30)
        return super()._open_stream(messages, **kwargs)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("a_gets", ["a reply", "an error"])
def test_a_turn_finished_elsewhere_while_its_runner_lost_the_connection_is_answered_once(
    alice: Any, chat_agent: Agent, monkeypatch: pytest.MonkeyPatch, use_provider: Any, a_gets: str
) -> None:
    """Runner A stalls while the model answers (its connection cut, its lease run out), and the sweep finishes
    the turn. When A's model call returns, A writes nothing (it had written a second reply over the first,
    and enqueued the memory write twice)."""
    from orchestrator.runtime import stuck_turns_recover

    first = _GatedProvider(["Reply of runner A."] if a_gets == "a reply" else [LLMServerError("upstream 503")])
    recovery = ScriptedProvider(default="Reply of the recovery.")
    use_provider(lambda _agent, _cheap: first if threading.current_thread().name == "runner-A" else recovery)
    enqueued: list[int] = []
    monkeypatch.setattr("orchestrator.finish.memory_writes_enqueue", lambda *, turn: enqueued.append(turn.pk))
    session = session_create(user=alice, agent=chat_agent)
    outcome: dict[str, Any] = {}

    def run_a() -> None:
        try:
            outcome["events"] = list(turn_stream(session=ChatSession.objects.get(pk=session.pk), message="hello"))
        finally:
            connection.close()

    runner = threading.Thread(target=run_a, name="runner-A")
    runner.start()
    assert first.in_call.wait(30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [first.backend_pid])
    SessionLease.objects.filter(session_id=session.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    wait_for(lambda: stuck_turns_recover(older_than=timedelta(0)) == 1, message="the sweep finishing the turn")
    turn = Turn.objects.get(session=session)
    assert (turn.status, turn.assistant_message) == (Turn.Status.COMPLETED, "Reply of the recovery.")

    first.gate.set()
    runner.join(30)

    turn.refresh_from_db()
    assert (turn.status, turn.assistant_message) == (Turn.Status.COMPLETED, "Reply of the recovery.")
    assert outcome["events"][-1]["type"] == "error" and outcome["events"][-1]["code"] == "turn_taken_over"
    assert enqueued == [turn.pk]
    assert ChatSession.objects.get(pk=session.pk).retry_count == 0


@pytest.mark.django_db(transaction=True)
def test_two_staff_replies_at_once_both_land(alice: Any, chat_agent: Agent, staff: Any) -> None:
    from django.contrib.auth import get_user_model

    from orchestrator.runtime import handoff_reply

    session = session_create(user=alice, agent=chat_agent)
    turn_run(session=session, message="I want a human")
    ChatSession.objects.filter(pk=session.pk).update(status=ChatSession.Status.NEEDS_HUMAN)
    other = get_user_model().objects.create_user(username="ben", password="ben-pass-123", is_staff=True)
    barrier = threading.Barrier(2, timeout=20)

    class Author:  # both read the turn, then both write: the read-modify-write kept only one reply
        def __init__(self, user: Any) -> None:
            self.user = user

        def get_username(self) -> str:
            barrier.wait()
            return str(self.user.username)

    def reply(user: Any) -> None:
        try:
            handoff_reply(session=session, text=f"hello from {user.username}", author=Author(user))
        finally:
            connection.close()

    threads = [threading.Thread(target=reply, args=(user,)) for user in (staff, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    text = Turn.objects.get(session=session, seq=1).assistant_message
    assert "hello from staff" in text and "hello from ben" in text


@pytest.mark.django_db(transaction=True)
def test_a_session_is_not_deleted_under_its_running_turn(alice: Any, chat_agent: Agent, staff: Any) -> None:
    """Deleting under a running turn failed that turn with a 500; the delete now waits for the lock."""
    from django.test import Client

    from sessions.services import session_delete

    session = session_create(user=alice, agent=chat_agent)
    admin = Client()
    admin.force_login(staff)
    with _lock_held_elsewhere(session.pk):
        with pytest.raises(SessionBusyError):
            session_delete(session=session)
        page = admin.post(f"/admin/chat_sessions/chatsession/{session.pk}/delete/", {"post": "yes"}, follow=True)
        body = page.content.decode()
        assert "a turn is running on this session" in body and "deleted successfully" not in body
        bulk = admin.post(
            "/admin/chat_sessions/chatsession/",
            {"action": "delete_selected", "_selected_action": [str(session.pk)]},
            follow=True,
        ).content.decode()
        assert "Not deleted, a turn is running on them" in bulk and "Successfully deleted" not in bulk
        assert ChatSession.objects.filter(pk=session.pk).exists()
    done = admin.post(
        "/admin/chat_sessions/chatsession/",
        {"action": "delete_selected", "_selected_action": [str(session.pk)]},
        follow=True,
    )
    assert "Deleted 1 session(s)." in done.content.decode()
    assert not ChatSession.objects.filter(pk=session.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_the_sweep_leaves_a_turn_whose_runner_is_alive(alice: Any, chat_agent: Agent) -> None:
    """A slow model past STUCK_TURN_SECONDS is not a crash: while its runner holds the lock, the sweep must
    not answer the turn a second time."""
    from orchestrator.runtime import stuck_turns_recover

    session = session_create(user=alice, agent=chat_agent)
    handle = turn_stream(session=session, message="hello")  # saved and running
    handle.close()  # as if its process had died ...
    turn = Turn.objects.get(session=session)
    with _lock_held_elsewhere(session.pk):  # ... but a live runner holds the session's lock
        assert stuck_turns_recover(older_than=timedelta(0)) == 0
        turn.refresh_from_db()
        assert turn.status == Turn.Status.RUNNING and turn.assistant_message == ""
        assert not LLMCall.objects.filter(turn=turn).exists()
    assert stuck_turns_recover(older_than=timedelta(0)) == 1  # once the runner is gone, the sweep finishes it


@pytest.mark.django_db(transaction=True)
def test_the_sweep_sends_each_stuck_turn_to_a_recovery_task_of_its_own(
    alice: Any, chat_agent: Agent, celery_worker: Any
) -> None:
    """One task recovering every stuck turn had one time limit for all of them: after a crash with many, it
    cut the turn it was answering short (and failed it). Each turn now has its task, sent once a window."""
    from orchestrator.runtime import stuck_turns_enqueue

    for i in range(3):
        turn_stream(session=session_create(user=alice, agent=chat_agent), message=f"hello {i}").close()
    assert Turn.objects.filter(status=Turn.Status.RUNNING).count() == 3

    assert stuck_turns_enqueue(older_than=timedelta(0)) == 3
    assert stuck_turns_enqueue(older_than=timedelta(0)) == 0  # sent already: not again while its task may run
    wait_for(
        lambda: not Turn.objects.exclude(status=Turn.Status.COMPLETED).exists(),
        timeout=60,
        message=f"the recovery tasks; worker log:\n{celery_worker.log_text()[-4000:]}",
    )
    assert all(Turn.objects.values_list("assistant_message", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_switched_off_agents_unfinished_turn_is_closed_unanswered_by_the_sweep(
    alice: Any, chat_agent: Agent, scripted: ScriptedProvider
) -> None:
    """Switched off while a turn of it was cut off: the sweep closes that turn, saying why, and never asks
    the model (an operator switching an agent off for misbehaviour or cost)."""
    from orchestrator.runtime import stuck_turns_recover

    session = session_create(user=alice, agent=chat_agent)
    turn_stream(session=session, message="hello").close()
    Agent.objects.filter(pk=chat_agent.pk).update(is_active=False)

    assert stuck_turns_recover(older_than=timedelta(0)) == 1
    turn = Turn.objects.get(session=session)
    assert turn.status == Turn.Status.FAILED and "switched off" in turn.assistant_message
    assert scripted.requests == [] and not LLMCall.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_handed_over_lease_is_claimed_once_and_one_never_claimed_is_let_go(alice: Any, chat_agent: Agent) -> None:
    """The door hands the lease to a turn worker with the task; the worker claims it under an owner of its own, so a
    second delivery of the same task cannot run the turn beside it; a hand-over that nobody claimed, whose task
    the sweep found in no queue, is let go, and its turn is then an orphan for the sweep."""
    from sessions.locks import session_is_locked, unclaimed_leases_let_go
    from sessions.selectors import orphaned_turns_find, unclaimed_lease_owners

    session = session_create(user=alice, agent=chat_agent)
    door = SessionTurnLock(session.pk)
    assert door.try_acquire()
    handed = door.hand_over(seconds=300)
    assert unclaimed_lease_owners(older_than=timedelta(0)) == [handed]
    worker = SessionTurnLock(session.pk)
    assert worker.claim(handed) and worker.owner != uuid.UUID(handed)
    assert not SessionTurnLock(session.pk).claim(handed)  # a second delivery: the run holds it
    assert unclaimed_lease_owners(older_than=timedelta(0)) == []
    assert unclaimed_leases_let_go([handed], older_than=0) == []  # claimed: nothing to let go
    worker.release()

    handle = turn_stream(session=session, message="hello")  # a turn, saved and running under a new lease
    assert isinstance(handle, TurnStream)
    lost = handle._handle.lock
    assert lost is not None
    owner = lost.hand_over(seconds=300)  # handed over ... and its task lost
    turn = Turn.objects.get(session=session)
    assert session_is_locked(session.pk) and not orphaned_turns_find(older_than=timedelta(0)).filter(pk=turn.pk)
    assert unclaimed_leases_let_go([owner], older_than=3600) == []  # not unclaimed for that long yet
    assert unclaimed_leases_let_go([owner], older_than=0) == [session.pk]
    assert not session_is_locked(session.pk)
    assert list(orphaned_turns_find(older_than=timedelta(0)).values_list("pk", flat=True)) == [turn.pk]
