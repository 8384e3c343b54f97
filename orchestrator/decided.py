"""A workflow's decision inside its reply's own call: one structured output a turn, its decision's fields first and
its reply last, the reply streamed to the user while the model writes it (``BaseProvider.stream_structured``).

The decision is settled before a word of the reply is shown, with every guarantee of the separate call: validated
against the workflow's ``Literal`` of states, recorded with its reasoning and confidence, applied through the FSM
(``transition_apply``, which writes its checkpoint), a confidence under the agent's threshold kept as the safe
default (nothing changes). When the reply the model is writing could claim what did not happen (the decision was
invalid, unsure or refused in part, an action must run first, a person takes over), the call is stopped there and
nothing of it is shown: the turn goes on as a two-call turn does (its reply asks again, explains what was refused,
or reports the action's result). A reply whose decision stands is the turn's answer: one model call.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Generator, Iterator
from typing import Any, Literal

from pydantic import ValidationError

from llm.base import LLMClientError, LLMError, StructuredOutputError, TruncatedOutputError
from llm.prompt import ContextBudget, build_prompt
from llm.provider_base import Decided, schema_instruction
from observability.tracing import span
from orchestrator.context import TurnContext, TurnEvent
from orchestrator.reply import answered, prompt_inputs
from orchestrator.steps import apply_decision, decides_now, handoff, stay_unsure, workflow_decides_in_reply
from sessions.services import turn_failure_record

logger = logging.getLogger(__name__)

# Tokens the decision's fields take before the reply (added to the reply's limit for the one call).
DECISION_TOKENS = 400

Verdict = Literal["reply", "stop"]


def decide_in_reply(ctx: TurnContext) -> Iterator[TurnEvent]:
    """The pipeline's step: a workflow turn that decides on this message decides inside its reply's call where the
    endpoint streams structured output (``steps.workflow_decides_in_reply``); the separate decision is skipped
    when it did (``ctx.decided``)."""
    if not decides_now(ctx) or not workflow_decides_in_reply(ctx.agent, ctx.workflow, ctx.provider):
        return
    ctx.decided = yield from decide_and_reply(ctx)


def decide_and_reply(ctx: TurnContext) -> Generator[TurnEvent, None, bool]:
    """Decide and reply in one call. True: the decision was taken in it (the turn answered, or its state settled
    and the separate reply to follow); False: the endpoint could not (the separate decision call follows)."""
    session, workflow, agent = ctx.session, ctx.workflow, ctx.agent
    budget = ContextBudget.from_agent(agent)
    schema = workflow.reply_schema
    guide = workflow.decided_reply_guide(state=session.state, data=session.data)
    if tools := reply_tools(ctx):
        guide += (
            f"\nTools you may need to answer: {', '.join(tools)}. If your reply needs one of them, set `needs_tool` "
            "to true and leave `reply` empty: the tool runs first, then you reply."
        )
    inputs = prompt_inputs(ctx, [], [])
    inputs = dataclasses.replace(
        inputs,
        workflow_text=f"{inputs.workflow_text}\n\n{guide}",
        fixed_instructions=schema_instruction(schema),  # counted here; the endpoint's request does not add it again
    )
    with span("context.build"):
        built = build_prompt(inputs=inputs, budget=budget, counter=ctx.counter)
    ctx.before_call()
    stream = ctx.provider.stream_structured(
        built.messages,
        schema=schema,
        ctx=ctx.call("reply", prompt_sections=built.sections),
        max_tokens=budget.reply_tokens + DECISION_TOKENS,
        temperature=0.0,  # the decision steers control flow: as deterministic as the separate call
    )
    ctx.composition_extra["route"] = {"path": "in_reply", "decision": "pending"}
    verdict: Verdict | None = None
    shown: list[str] = []
    try:
        with span("llm.call", purpose="reply", decision="in_reply"):
            for event in stream:
                if isinstance(event, Decided):
                    verdict = yield from _settle(ctx, event.fields)
                    if verdict == "stop":
                        stream.stop()
                        break
                    continue
                shown.append(event)
                yield {"type": "delta", "text": event}
    except StructuredOutputError as exc:
        if verdict is None:  # never one valid decision: as when the separate call gives none
            _no_valid_decision(ctx, exc)
            yield _failed_decision_event(ctx, exc)
            return True
        # The reply was written whole; something after it did not fit the schema: the reply stands.
        logger.warning("turn %s: the object after its reply is not valid: %s", ctx.turn.pk, exc)
    except LLMClientError as exc:
        if verdict is not None:
            raise
        # The endpoint refused the request (a streamed structured reply it does not take): decide in a call of
        # its own, now and for a while (``llm.capabilities``).
        ctx.provider.streamed_decision_failed(str(exc))
        ctx.composition_extra["route"] = {"path": "workflow_call", "fallback": f"in_reply refused ({exc.status})"}
        return False
    except LLMError as exc:  # cut off by the token limit, or the stream broke
        if verdict is None:
            if not isinstance(exc, TruncatedOutputError):
                # The stream broke before the decision (a server that cannot serve the schema's grammar drops it):
                # this turn decides in a call of its own; a model that cannot answer fails that call as any turn.
                logger.warning(
                    "turn %s: the decision's stream broke (%s); deciding in a call of its own", ctx.turn.pk, exc
                )
                ctx.composition_extra["route"] = {
                    "path": "workflow_call",
                    "fallback": f"in_reply broke ({exc.outcome})",
                }
                return False
            _no_valid_decision(ctx, exc)
            yield _failed_decision_event(ctx, exc)
            return True
        if verdict == "reply" and "".join(shown).strip():
            # The decision stands and its reply was being written: the reply step continues what the user saw,
            # as it continues a reply of its own (a continuation that fails keeps it, marked cut off).
            ctx.reply_so_far = "".join(shown)
            ctx.composition_extra["route"]["decision"] = "applied"
            return True
    if ctx.done or verdict != "reply":
        return True
    text = "".join(shown).strip()
    if not text:
        return True  # the decision stands but it wrote no reply: the separate reply follows
    ctx.composition_extra["route"]["decision"] = "applied"
    yield from answered(ctx, built, text, steps=1, continuations=0, truncated=False)
    return True


def reply_tools(ctx: TurnContext) -> list[str]:
    """The agent's tools its reply may call (a workflow's action tools run in their own states only)."""
    actions = {a for a in ctx.workflow.action_states.values() if isinstance(a, str)}
    return [t for t in ctx.agent.tools or [] if isinstance(t, str) and t not in actions]


def _settle(ctx: TurnContext, fields: dict[str, Any]) -> Generator[TurnEvent, None, Verdict]:
    """Validate and apply the decision written before the reply; "reply" when the reply may be shown as written."""
    session, workflow, route = ctx.session, ctx.workflow, ctx.composition_extra["route"]
    try:
        decision = workflow.decision_schema.model_validate(fields)
    except ValidationError as exc:
        error = StructuredOutputError(f"invalid decision: {exc.errors()[0]['msg']}", validation_error=str(exc))
        _no_valid_decision(ctx, error)
        route["decision"] = "invalid"
        yield _failed_decision_event(ctx, error)
        return "stop"
    route.update(confidence=decision.confidence, reasoning=decision.reasoning[:300], next_state=decision.next_state)
    if decision.wants_person:
        route["decision"] = "handoff"
        yield from handoff(ctx, reason="the user asked for a person")
        return "stop"
    if decision.confidence < ctx.agent.routing_confidence_threshold:
        route["decision"] = "unsure"
        yield from stay_unsure(ctx, decision)
        return "stop"
    before = session.state
    outcome = yield from apply_decision(ctx, decision)
    ctx.refused = list(outcome.slot_errors)
    if not outcome.applied or outcome.slot_errors:
        route["decision"] = "refused"  # the reply being written would claim it: the separate reply explains
        return "stop"
    state = session.state
    if state in workflow.action_states or (state in workflow.handoff_states and state != before):
        route["decision"] = "action" if state in workflow.action_states else "handoff_state"
        return "stop"  # the action runs (or a person takes over) before anything is said
    if fields.get("needs_tool") is True and reply_tools(ctx):
        route["decision"] = "use_tools"
        return "stop"  # the reply that may call the tool follows (as the agent's free chat does: call, then reply)
    return "reply"


def _no_valid_decision(ctx: TurnContext, exc: LLMError) -> None:
    # No valid decision: nothing changes, the failure is counted, and the separate reply asks again.
    logger.warning("turn %s: no valid workflow decision inside the reply: %s", ctx.turn.pk, exc)
    ctx.composition_extra.setdefault("route", {})["decision"] = "invalid"
    turn_failure_record(
        session=ctx.session, turn=ctx.turn, reason=f"no valid workflow decision ({_code(exc)}, inside the reply)"
    )
    ctx.reload()


def _failed_decision_event(ctx: TurnContext, exc: LLMError) -> TurnEvent:
    event = ctx.state_event()
    event["error"] = f"No valid decision from the model ({_code(exc)}); nothing was changed."
    return event


def _code(exc: LLMError) -> str:
    return f"llm_{exc.outcome}"
