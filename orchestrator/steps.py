"""The steps of a turn before its reply: each reads and extends the ``TurnContext`` and yields events;
a step that ends the turn sets ``ctx.done``."""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from typing import Any

from django.conf import settings

from agents.routing import route_message
from agents.workflows import get_workflow
from agents.workflows.base import ActionContext, ActionFailed
from llm.base import LLMError, StructuredOutputError
from llm.prompt import ContextOverflowError
from llm.providers import get_provider
from memory.retrieval import RecentWindow, memories_for_prompt, retrieval_query
from observability.tracing import memory_annotate, span
from orchestrator.context import (
    HANDOFF_NOTICE,
    TurnContext,
    TurnEvent,
    done_event,
)
from orchestrator.finish import hand_off_turn, keep_for_person
from sessions.context import turn_history
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import TransitionOutcome, checkpoint_record, transition_apply, turn_failure_record

logger = logging.getLogger(__name__)


def stop_if_handed_off(ctx: TurnContext) -> Iterator[TurnEvent]:
    """A session handed to a person: the message is kept for them, the agent does not answer."""
    if ctx.session.status != ChatSession.Status.NEEDS_HUMAN:
        return
    keep_for_person(ctx.session, ctx.turn)
    ctx.done = True
    yield ctx.state_event()
    yield done_event(ctx.turn, ctx.session)


def retrieve(ctx: TurnContext) -> Iterator[TurnEvent]:
    """Memories. The turns the prompt will show are read once, here: retrieval searches with the user's
    earlier messages and leaves out the episodes of turns the prompt shows anyway. Memory is an aid: its
    failure is reported, never fails the turn."""
    ctx.history = history = turn_history(session=ctx.session, before_seq=ctx.turn.seq)
    with span("retrieval") as current:
        try:
            query = retrieval_query(message=ctx.message, earlier=[t.user for t in history.newest], agent=ctx.agent)
            retrieved = memories_for_prompt(
                user=ctx.session.user,
                query=query.text,
                agent=ctx.agent,
                workflow=ctx.workflow.name,
                budget_tokens=ctx.agent.memory_budget_tokens,
                relevance_threshold=ctx.agent.relevance_threshold,
                touch=False,  # counted by the turn's memory-write task, off the request path
                window=RecentWindow(session_id=ctx.session.pk, after_seq=history.floor),
            )
            retrieved.query_source = query.source
            ctx.retrieved, ctx.retrieval_report = retrieved, retrieved.as_report()
            memory_annotate(current, operation="search", kept=len(retrieved.items))
        except Exception as exc:
            logger.exception("memory retrieval failed; answering without memories")
            # Shown to the user (memory panel, composition API): the kind of failure, not its text (in the log).
            ctx.retrieved = None
            ctx.retrieval_report = {"error": f"retrieval failed ({type(exc).__name__})", "items": [], "candidates": []}
    return
    yield  # a generator: this step yields no event


def decide(ctx: TurnContext) -> Iterator[TurnEvent]:
    """The workflow's decision for this message (structured output only), applied or refused; the slot
    values it refused are kept for the reply to explain."""
    session, workflow = ctx.session, ctx.workflow
    if ctx.decided or not decides_now(ctx):
        return
    if ctx.history is not None:  # read by retrieval already
        recent = [(t.user, t.assistant) for t in ctx.history.newest[-3:]]
    else:
        recent = [
            (t.user_message, t.assistant_message)
            for t in session.turns.filter(status=Turn.Status.COMPLETED).order_by("-seq")[:3]
        ][::-1]
    messages = workflow.decision_messages(
        state=session.state, data=session.data, user_message=ctx.message, recent_turns=recent
    )
    ctx.before_call()
    try:
        with span("llm.call", purpose="slots"):
            decision = ctx.provider.structured(messages, schema=workflow.decision_schema, ctx=ctx.call("slots"))
    except (StructuredOutputError, LLMError) as exc:
        # No valid decision: nothing changes, the failure is counted, and the reply asks again.
        logger.warning("turn %s: no valid workflow decision: %s", ctx.turn.pk, exc)
        turn_failure_record(session=session, turn=ctx.turn, reason=f"no valid workflow decision ({error_code(exc)})")
        ctx.reload()
        event = ctx.state_event()
        # The user sees this (and the checkpoint log, through the API): the exception's text (addresses,
        # upstream messages) is in the log only.
        event["error"] = f"No valid decision from the model ({error_code(exc)}); nothing was changed."
        yield event
        return
    if getattr(decision, "wants_person", False):
        # Asking for a person is a routing outcome of the decision, in every workflow: a person takes over.
        yield from handoff(ctx, reason="the user asked for a person")
        return
    if getattr(decision, "confidence", 1.0) < ctx.agent.routing_confidence_threshold:
        yield from stay_unsure(ctx, decision)
        return
    outcome = yield from apply_decision(ctx, decision)
    ctx.refused = list(outcome.slot_errors)


def decides_now(ctx: TurnContext) -> bool:
    """Does this turn's workflow decide on this message (not a free chat; a state that decides; not decided before
    this turn was cut off and resumed)?"""
    session, workflow = ctx.session, ctx.workflow
    if workflow.is_free_chat or not workflow.decides_in(session.state):
        return False
    if ctx.resumed and session.checkpoints.filter(turn=ctx.turn, reason=Checkpoint.Reason.TRANSITION).exists():
        return False  # decided before this turn was cut off and resumed
    return True


def stay_unsure(ctx: TurnContext, decision: Any) -> Iterator[TurnEvent]:
    """A decision under the agent's confidence threshold: the safe default is to stay where we are (and keep what
    we have), recorded with why."""
    threshold = ctx.agent.routing_confidence_threshold
    checkpoint_record(
        session=ctx.session,
        reason=Checkpoint.Reason.INVALID_TRANSITION,
        turn=ctx.turn,
        detail=f"decision confidence {decision.confidence:.2f} below {threshold:.2f}: not applied",
    )
    ctx.reload()
    yield ctx.state_event()


def act(ctx: TurnContext) -> Iterator[TurnEvent]:
    """A state whose action is a Python function runs it on entering (no model call): its structured output
    sets slots and moves to the success outcome; ``ActionFailed`` (or any error, logged) to the failure one."""
    session, workflow = ctx.session, ctx.workflow
    action = workflow.python_action(session.state)
    if action is None:
        return
    success, failure = workflow.action_outcomes[session.state]
    name = getattr(action, "__name__", "action")
    context = ActionContext(user=session.user, agent=ctx.agent, session_id=session.pk, data=dict(session.data))
    with span("action", name=name):
        try:
            target, slots, why = success, workflow.action_slots(action(context) or {}), f"{name} succeeded"
        except ActionFailed as exc:
            target, slots, why = failure, {}, f"{name}: {exc}"
        except Exception:
            logger.exception("turn %s: action %s failed", ctx.turn.pk, name)
            target, slots, why = failure, {}, f"{name} failed (see the log)"
    decision = workflow.decision(next_state=target, slots=slots, reasoning=why[:1000])
    yield from apply_decision(ctx, decision)


def apply_decision(ctx: TurnContext, decision: Any) -> Generator[TurnEvent, None, TransitionOutcome]:
    """Apply a decision to the session and report the state (with what was refused, if it was)."""
    # The session as written (``transition_apply`` mirrors what it writes on the instance, under the version
    # check); the checkpoint it wrote holds the state the next model call starts from.
    outcome = transition_apply(session=ctx.session, turn=ctx.turn, decision=decision)
    ctx.checkpoint_fresh = outcome.checkpoint is not None
    event = ctx.state_event()
    if not outcome.applied:
        event["rejected"] = list(outcome.errors)
    yield event
    return outcome


def hand_off_if_the_workflow_says(ctx: TurnContext) -> Iterator[TurnEvent]:
    """A workflow's handoff state, entered in this turn (by the decision or an action), hands the session
    to a person. (A session given back in that state is not handed off again until it leaves and returns.)"""
    state = ctx.session.state
    if state in ctx.workflow.handoff_states and state != ctx.turn.state_before:
        yield from handoff(ctx, reason=f"the workflow reached {state}")


def route(ctx: TurnContext) -> Iterator[TurnEvent]:
    """Which tools the reply may use. An agent with tools and no workflow decision to make decides inside its
    reply's own call where the endpoint takes tools there (``decides_in_reply``): its tools and the hand-off are
    offered to that call as functions, plain text is the answer, and a turn that needs no tool makes one model
    call. Elsewhere (an endpoint seen refusing tools; ``TURN_DECISION_IN_REPLY`` off) it is routed by a structured
    call of its own first (use tools, answer, or hand off). A workflow's action states offer their own tool."""
    ctx.tool_names = [t for t in (ctx.agent.tools or []) if isinstance(t, str)]
    if not ctx.tool_names or not ctx.workflow.is_free_chat:
        return
    if _decides_in_reply(ctx.provider):
        ctx.decision_in_reply = True
        ctx.composition_extra["route"] = {"path": "in_reply", "tools": list(ctx.tool_names)}
        return
    ctx.before_call()
    with span("llm.call", purpose="route"):
        outcome = route_message(
            provider=ctx.provider,
            message=ctx.message,
            tool_names=ctx.tool_names,
            ctx=ctx.call("route"),
            confidence_threshold=ctx.agent.routing_confidence_threshold,
        )
    ctx.composition_extra["route"] = {**outcome.as_dict(), "path": "route_call"}
    if outcome.action == "handoff":
        yield from handoff(ctx, reason=f"routing: {outcome.reasoning or 'handoff'}")
    elif outcome.action == "answer":
        ctx.tool_names = []


def decision_path(agent: Any) -> str:
    """How ``agent``'s turn decides, as ``route`` and ``decide`` would now (``/ops/`` shows it): "in_reply" (one model
    call for a turn that needs no tool), "route_call" (a routing call, then the reply), "workflow_in_reply" (the
    workflow's decision first in the reply's own call), "workflow_call" (the workflow's structured decision, then
    the reply), or "none" (a free chat without tools: the reply, with the hand-off offered in it)."""
    workflow = get_workflow(agent.workflow)
    if not workflow.is_free_chat:
        in_reply = workflow_decides_in_reply(agent, workflow, get_provider(agent=agent))
        return "workflow_in_reply" if in_reply else "workflow_call"
    if not [t for t in (agent.tools or []) if isinstance(t, str)]:
        return "none"
    return "in_reply" if _decides_in_reply(get_provider(agent=agent)) else "route_call"


def workflow_decides_in_reply(agent: Any, workflow: Any, provider: Any) -> bool:
    """May a workflow turn of ``agent`` decide inside its reply's call (``orchestrator.decided``)? The setting on, and
    an endpoint that streams structured output. (A reply that needs one of the agent's tools says so in the decision,
    ``needs_tool``: the call stops there and the reply that may call it follows.)"""
    return bool(getattr(settings, "TURN_DECISION_IN_REPLY", True)) and bool(provider.streams_decisions())


def _decides_in_reply(provider: Any) -> bool:
    """The one rule ``route`` runs by and ``decision_path`` reports: the setting on, and an endpoint that takes tools."""
    return bool(getattr(settings, "TURN_DECISION_IN_REPLY", True)) and bool(provider.decides_in_reply())


def handoff(ctx: TurnContext, *, reason: str, said: str = "") -> Iterator[TurnEvent]:
    """Hand the session to a person (``finish.hand_off_turn``): the turn is answered with a notice (after what
    the model ``said`` first, which the user has seen streamed), and the agent stops answering."""
    hand_off_turn(ctx.session, ctx.turn, reason=reason, said=said)
    ctx.done = True
    yield {"type": "delta", "text": ("\n\n" if said.strip() else "") + HANDOFF_NOTICE}
    yield ctx.state_event()
    yield done_event(ctx.turn, ctx.session)


def error_code(exc: Exception) -> str:
    if isinstance(exc, LLMError):
        return f"llm_{exc.outcome}"
    return "context_overflow" if isinstance(exc, ContextOverflowError) else "turn_failed"


def describe(exc: Any) -> str:
    """``error_code`` with the exception's class, for the checkpoint log (its text stays in the log)."""
    return f"{getattr(exc, 'code', None) or error_code(exc)} ({type(exc).__name__})"
