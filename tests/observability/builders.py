"""Records for the indicators, written straight to the database with chosen timestamps."""

from __future__ import annotations

import datetime as dt
from typing import Any

from agents.models import Agent, LLMCall, ToolInvocation
from sessions.models import ChatSession, Checkpoint, Turn
from tests import world


def make_agent(slug: str) -> Agent:
    return world.make_agent("booking", slug=slug, name=slug.title(), system_prompt="You help.")


def make_session(*, user: Any, agent: Agent, state: str = "IDLE") -> ChatSession:
    return ChatSession.objects.create(user=user, agent=agent, workflow=agent.workflow, state=state)


def _stamp(model: Any, obj: Any, at: dt.datetime) -> Any:
    # created_at is auto_now_add: set the chosen moment after the insert.
    model.objects.filter(pk=obj.pk).update(created_at=at)
    obj.created_at = at
    return obj


def make_turn(
    *,
    session: ChatSession,
    seq: int,
    at: dt.datetime,
    prompt_tokens: int = 0,
    step_limit_hit: bool = False,
    degradations: list[str] | None = None,
    state_before: str = "",
    state_after: str = "",
) -> Turn:
    turn = Turn.objects.create(
        session=session,
        seq=seq,
        user_message=f"message {seq}",
        status=Turn.Status.COMPLETED,
        prompt_tokens=prompt_tokens,
        step_limit_hit=step_limit_hit,
        composition={"degradations": degradations or [], "sections": {}},
        state_before=state_before,
        state_after=state_after,
    )
    return _stamp(Turn, turn, at)


def make_call(
    *,
    at: dt.datetime,
    agent: Agent | None,
    session: ChatSession | None = None,
    turn: Turn | None = None,
    prompt_tokens: int = 1000,
    retries: int = 0,
    ttft_ms: float | None = 400.0,
    purpose: str = "chat",
) -> LLMCall:
    call = LLMCall.objects.create(
        agent=agent,
        session=session,
        turn=turn,
        purpose=purpose,
        provider="fake",
        model="fake-model",
        prompt_tokens=prompt_tokens,
        completion_tokens=50,
        latency_ms=900.0,
        ttft_ms=ttft_ms,
        retries=retries,
        outcome="ok",
    )
    return _stamp(LLMCall, call, at)


def make_checkpoint(
    *, session: ChatSession, seq: int, at: dt.datetime, reason: str, state: str = "IDLE", turn: Turn | None = None
) -> Checkpoint:
    checkpoint = Checkpoint.objects.create(session=session, seq=seq, state=state, reason=reason, turn=turn)
    return _stamp(Checkpoint, checkpoint, at)


def make_tool_run(*, session: ChatSession, at: dt.datetime, ok: bool, turn: Turn | None = None) -> ToolInvocation:
    run = ToolInvocation.objects.create(
        session=session,
        turn=turn,
        name="search_flights",
        ok=ok,
        result="[]" if ok else "TOOL_ERROR: upstream 503",
        error_kind="" if ok else "http_503",
    )
    return _stamp(ToolInvocation, run, at)


def build_death_spiral(*, user: Any, agent: Agent, now: dt.datetime) -> ChatSession:
    """A session going round in circles: tokens per call climbing, retries and slow first tokens in the
    last quarter hour, the FSM bouncing between two states and reset seven times in ten minutes."""
    session = make_session(user=user, agent=agent, state="COLLECTING")
    seq = 0
    # The hour before: steady.
    for k in range(20):
        seq += 1
        at = now - dt.timedelta(minutes=115) + dt.timedelta(minutes=2.5 * k)
        turn = make_turn(session=session, seq=seq, at=at, prompt_tokens=1000, state_before="IDLE", state_after="IDLE")
        make_call(at=at, agent=agent, session=session, turn=turn, prompt_tokens=1000)
        make_call(at=at, agent=agent, session=session, turn=turn, prompt_tokens=600, purpose="slots")
    # The last hour: every turn's prompt bigger than the last; the final quarter hour retries and stalls.
    for k in range(30):
        seq += 1
        at = now - dt.timedelta(minutes=59) + dt.timedelta(minutes=2 * k)
        recent = at >= now - dt.timedelta(minutes=15)
        tokens = 1300 + 100 * k
        turn = make_turn(
            session=session,
            seq=seq,
            at=at,
            prompt_tokens=tokens,
            step_limit_hit=recent,
            degradations=["recent_turns_dropped"] if recent else None,
        )
        make_call(
            at=at,
            agent=agent,
            session=session,
            turn=turn,
            prompt_tokens=tokens,
            retries=2 if recent else 0,
            ttft_ms=9500.0 if recent else 700.0,
        )
        make_call(at=at, agent=agent, session=session, turn=turn, prompt_tokens=600 + 50 * k, purpose="slots")
    cp = 0
    for i, state in enumerate(["ASK_DESTINATION", "ASK_DATES", "ASK_DESTINATION", "ASK_DATES", "ASK_DESTINATION"]):
        cp += 1
        make_checkpoint(
            session=session, seq=cp, at=now - dt.timedelta(minutes=30 - i), reason="transition", state=state
        )
    for i in range(7):
        cp += 1
        make_checkpoint(session=session, seq=cp, at=now - dt.timedelta(minutes=9 - i), reason="reset", state="IDLE")
    return session


def build_healthy_run(*, user: Any, agent: Agent, now: dt.datetime, sessions: int = 3) -> list[ChatSession]:
    """Steady traffic over two hours: flat prompts, no retries, quick first tokens, forward-only workflows."""
    made = []
    for s in range(sessions):
        session = make_session(user=user, agent=agent, state="ASK_DESTINATION")
        for k in range(24):
            at = now - dt.timedelta(minutes=118) + dt.timedelta(minutes=5 * k + s)
            tokens = 1000 + (k % 3) * 20
            turn = make_turn(session=session, seq=k + 1, at=at, prompt_tokens=tokens)
            make_call(at=at, agent=agent, session=session, turn=turn, prompt_tokens=tokens, ttft_ms=350.0 + k % 5)
            make_call(at=at, agent=agent, session=session, turn=turn, prompt_tokens=600, purpose="slots")
            make_tool_run(session=session, at=at, ok=True, turn=turn)
        for i, state in enumerate(["ASK_DESTINATION", "ASK_DATES", "CONFIRM", "BOOKED"]):
            make_checkpoint(
                session=session, seq=i + 1, at=now - dt.timedelta(minutes=60 - 10 * i), reason="transition", state=state
            )
        made.append(session)
    return made
