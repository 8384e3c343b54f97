"""The reply: the prompt from budgeted sections, streamed, with the tools it asks for, under the step limit.

In a workflow's action state the state's tool is offered too, and its outcome moves the workflow
(``Workflow.action_outcomes``; the slots it sets come from the tool's structured output, never its text).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from agents.call_records import llm_calls_summary, tool_invocation_insert
from agents.tools import TOOL_ERROR_POLICY, ToolContext, run_tool_call, tool_specs
from agents.tools.execution import record_invocation
from llm.base import HANDOFF_TOOL, LLMError, Message, ToolCallRequest, ToolSpec, TruncatedOutputError
from llm.continuation import (
    CONTINUE_INSTRUCTION,
    MAX_CONTINUATIONS,
    continuation_messages,
    continuation_news,
    may_repeat,
)
from llm.prompt import BuiltPrompt, ContextBudget, MemoryItem, PromptInputs, build_prompt
from observability.tracing import span
from orchestrator.context import TurnContext, TurnEvent, done_event, error_event
from orchestrator.finish import complete_turn, fail_turn, mark_step_limit
from orchestrator.steps import handoff
from sessions.services import transition_apply, turn_failure_record

logger = logging.getLogger(__name__)


def reply(ctx: TurnContext) -> Iterator[TurnEvent]:
    """The reply: each step a prompt built within the budget and a streamed answer, then the tools it asked
    for, until an answer asks for none (completed), the model hands off, or the step limit."""
    agent = ctx.agent
    budget = ContextBudget.from_agent(agent)
    offer = _tools_offered(ctx)
    context = ToolContext(user=ctx.session.user, session=ctx.session, turn=ctx.turn, agent=agent)
    tool_messages: list[Message] = []
    reply_parts: list[str] = []
    built = None
    streamed = StreamedStep(text="")
    steps = continuations = 0
    while True:
        if steps >= agent.step_limit:
            yield from _at_step_limit(ctx, reply_parts)
            return
        steps += 1
        with span("context.build"):
            inputs = prompt_inputs(ctx, offer.specs, tool_messages)
            built = build_prompt(inputs=inputs, budget=budget, counter=ctx.counter)
        streamed = yield from _streamed_step(ctx, built, budget, offer.specs, step=steps)
        continuations += streamed.continuations
        if not streamed.calls:
            break
        if HANDOFF_TOOL in offer.specs and any(c.name == HANDOFF_TOOL.name for c in streamed.calls):
            said = "\n\n".join([*reply_parts, streamed.text]).strip()
            yield from handoff(ctx, reason=f"the model: {_handoff_reason(streamed.calls)}", said=said)
            return
        if streamed.text:
            reply_parts.append(streamed.text)
        yield from _tool_calls(ctx, offer, context, streamed, tool_messages)
    text = streamed.text if not reply_parts else "\n\n".join([*reply_parts, streamed.text]).strip()
    if ctx.decision_in_reply:  # what the reply's call decided: to answer, or to use tools first
        ctx.composition_extra["route"]["action"] = "use_tools" if steps > 1 else "answer"
    yield from answered(ctx, built, text, steps=steps, continuations=continuations, truncated=streamed.truncated)


@dataclass
class ToolOffer:
    """The tools a reply may call: their specs (an action state's tool forced on its first step), their names,
    and the action state's tool, if there is one."""

    specs: list[ToolSpec]
    names: list[str]
    action_tool: str | None


def _tools_offered(ctx: TurnContext) -> ToolOffer:
    session, agent, workflow = ctx.session, ctx.agent, ctx.workflow
    action_tool = workflow.action_tool(session.state)
    names = list(dict.fromkeys([*ctx.tool_names, *([action_tool] if action_tool else [])]))
    specs = tool_specs(names) if names else []
    if action_tool:
        # An action state's step is the call of its tool: the model is told to make it (tool_choice), once.
        specs = [dataclasses.replace(spec, forced=spec.name == action_tool) for spec in specs]
    if ctx.decision_in_reply:
        # The decision inside the reply's call: the agent's tools and the hand-off, each a function it may call;
        # optional, so that an endpoint that refuses tools is asked again without them (and remembered: its next
        # turns are routed by a call of their own).
        specs = [*(dataclasses.replace(spec, optional=True) for spec in specs), HANDOFF_TOOL]
    elif not specs and workflow.is_free_chat and not agent.tools:
        # A free chat with no tools of its own: asking for a person is the model's call of this tool (an
        # agent with tools is routed instead; a workflow's decision says ``wants_person``).
        specs = [HANDOFF_TOOL]
    return ToolOffer(specs=specs, names=names, action_tool=action_tool)


def _tool_calls(
    ctx: TurnContext, offer: ToolOffer, context: ToolContext, streamed: StreamedStep, tool_messages: list[Message]
) -> Iterator[TurnEvent]:
    """Run the tool calls a step asked for (results into ``tool_messages`` for the next step); an action state's
    call moves the workflow by its outcome."""
    session, workflow, calls = ctx.session, ctx.workflow, streamed.calls
    tool_messages.append(
        {
            "role": "assistant",
            # "" rather than null: OpenAI takes either, llama-cpp-python's server only a string.
            "content": streamed.text,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
            ],
        }
    )
    for call in calls:
        # An action's call is recorded with the outcome it leads to (``_apply_action``), in one transaction.
        is_action = call.name == offer.action_tool and session.state in workflow.action_outcomes
        with span("tool", name=call.name):
            result = run_tool_call(call=call, context=context, enabled=offer.names, record=not is_action)
        tool_messages.append({"role": "tool", "tool_call_id": call.id, "content": result.content})
        if call.name == offer.action_tool:
            offer.specs = [dataclasses.replace(spec, forced=False) for spec in offer.specs]
        # The outcome (and the call's record) first: a client gone at the next event cannot come between.
        applied = is_action and _apply_action(ctx, result, context)
        yield {"type": "tool", "name": call.name, "ok": result.ok, "error_kind": result.error_kind}
        if applied:
            yield ctx.state_event()


def answered(
    ctx: TurnContext, built: BuiltPrompt | None, text: str, *, steps: int, continuations: int, truncated: bool
) -> Iterator[TurnEvent]:
    """The reply is whole (or cut off and marked): the turn completed with what its prompt was made of."""
    composition = dict(built.composition) if built is not None else {}
    composition.update(ctx.composition_extra)
    composition["steps"] = steps
    composition["calls"] = llm_calls_summary(ctx.turn.pk)  # what the turn cost: calls and tokens by purpose
    if continuations:
        composition["continuations"] = continuations
    if truncated:
        composition["truncated"] = True
    complete_turn(
        ctx.session,
        ctx.turn,
        reply=text,
        steps=steps,
        composition=composition,
        retrieval=ctx.retrieval_report,
        prompt_tokens=built.total_tokens if built is not None else 0,
        is_demo=ctx.provider.is_demo,
        history=ctx.history,
        resets_failures=ctx.workflow.is_free_chat,
        truncated=truncated,
    )
    ctx.done = True
    yield ctx.state_event()
    yield done_event(ctx.turn, ctx.session)


@dataclass
class StreamedStep:
    """One step's reply as streamed: its text (continuations joined), the tool calls it asked for, and whether
    it is still cut off after the continuations it was allowed."""

    text: str
    calls: list[ToolCallRequest] = field(default_factory=list)
    continuations: int = 0
    truncated: bool = False


@dataclass
class _Continuing:
    """A step's reply across its continuations: the messages and sections of the next call, what was said."""

    messages: list[Message]
    sections: dict[str, int]
    parts: list[str] = field(default_factory=list)
    continuations: int = 0


@dataclass
class _Call:
    """One model call's streamed text, and whether it is held back (a continuation that may be a repeat)."""

    text: list[str]
    held: bool


def _streamed_step(
    ctx: TurnContext, built: BuiltPrompt, budget: ContextBudget, specs: list[ToolSpec], *, step: int
) -> Generator[TurnEvent, None, StreamedStep]:
    """Stream one model reply; a prose reply cut off by the token limit is continued (``llm.continuation``)
    while the grown prompt fits, ``MAX_CONTINUATIONS`` times at most, each call checkpointed first. A reply cut
    off in a tool call, or by anything but the length limit (a closed connection, a content filter), fails as
    before: it is not whole, and there is nothing safe to continue. A continuation that adds nothing (empty, or
    a repeat of what was said) ends the continuing: the reply is kept as it was and marked as cut off."""
    going = _Continuing(messages=built.messages, sections=dict(built.sections))
    if step == 1 and ctx.reply_so_far:
        # The reply began in the call that decided (``orchestrator.decided``) and was cut off there: this step
        # continues it, as the continuation of a reply of its own (the user saw what it said).
        going.parts.append(ctx.reply_so_far)
        going.continuations = 1
        going.messages = continuation_messages(built.messages, ctx.reply_so_far)
        grown = ctx.counter.count(ctx.reply_so_far) + ctx.counter.count(CONTINUE_INSTRUCTION) + 8
        going.sections = {**dict(built.sections), "continuation": grown}
    while True:
        ctx.before_call()
        said = "".join(going.parts)
        # A continuation's text is held back while it may still be a repeat of what was said (the user saw that
        # already); once it adds something, what it adds is shown and the rest streams as it comes.
        call = _Call(text=[], held=bool(going.continuations))
        with span("llm.call", purpose="reply", step=step, continuation=going.continuations):
            stream = ctx.provider.stream(
                going.messages,
                ctx=ctx.call("reply", prompt_sections=going.sections),
                temperature=ctx.agent.temperature,
                max_tokens=budget.reply_tokens,
                tools=specs or None,
            )
            try:
                yield from _deltas(stream, said, call)
            except LLMError as exc:
                ended = yield from _cut_off(ctx, exc, stream, built, budget, going, said, call)
                if ended is not None:
                    return ended
                continue
        return (yield from _whole(ctx, stream, going, said, call))


def _deltas(stream: Any, said: str, call: _Call) -> Iterator[TurnEvent]:
    for delta in stream:
        if not delta:
            continue
        call.text.append(delta)
        if not call.held:
            yield {"type": "delta", "text": delta}
        elif not may_repeat(said, "".join(call.text)):
            call.held = False
            if news := continuation_news(said, "".join(call.text)):
                yield {"type": "delta", "text": news}


def _cut_off(
    ctx: TurnContext,
    exc: LLMError,
    stream: Any,
    built: BuiltPrompt,
    budget: ContextBudget,
    going: _Continuing,
    said: str,
    call: _Call,
) -> Generator[TurnEvent, None, StreamedStep | None]:
    """A call that ended in an error: the step's reply as it stands (marked cut off), the error again (a first
    call that is not a prose reply cut by the length limit), or None with ``going`` set for one more call."""
    n = going.continuations
    if not isinstance(exc, TruncatedOutputError):
        if not n:
            raise exc
        # A continuation failed (the endpoint went away, a timeout): what was said stands, marked.
        logger.warning("turn %s: continuation %s failed: %s", ctx.turn.pk, n, exc)
        news = continuation_news(said, "".join(call.text))
        yield from _released(news, held=call.held)
        return StreamedStep(text=said + news, continuations=n, truncated=True)
    completion = stream.completion
    text = "".join(call.text) or exc.partial_text
    if completion is None or completion.finish_reason != "length" or completion.tool_calls or not text:
        if not n:
            raise exc
        # A continuation that ended otherwise (a filter, a closed stream): what was said stands.
        kept = text if completion is None or not completion.tool_calls else ""
        news = continuation_news(said, kept)
        yield from _released(news, held=call.held)
        return StreamedStep(text=said + news, continuations=n, truncated=True)
    news = continuation_news(said, text) if n else text
    yield from _released(news, held=call.held)
    if not news:
        # Cut again without adding anything (the same words again): asking once more would not help.
        logger.info("turn %s: continuation %s added nothing", ctx.turn.pk, n)
        return StreamedStep(text=said, continuations=n, truncated=True)
    going.parts.append(news)
    so_far = "".join(going.parts)
    grown = {"continuation": ctx.counter.count(so_far) + ctx.counter.count(CONTINUE_INSTRUCTION) + 8}
    if n >= MAX_CONTINUATIONS or built.total_tokens + grown["continuation"] > budget.prompt_limit:
        return StreamedStep(text=so_far, continuations=n, truncated=True)
    going.continuations += 1
    going.messages = continuation_messages(built.messages, so_far)
    going.sections = {**dict(built.sections), **grown}
    return None


def _whole(
    ctx: TurnContext, stream: Any, going: _Continuing, said: str, call: _Call
) -> Generator[TurnEvent, None, StreamedStep]:
    """A call that ended without an error: the step's reply, with the tool calls it asked for."""
    completion = stream.completion
    text = "".join(call.text) if call.text else (completion.text if completion else "")
    calls = list(completion.tool_calls) if completion else []
    if going.continuations:
        news = continuation_news(said, text)
        yield from _released(news, held=call.held)
        if not news and not calls:
            # A continuation that came back empty, or said again what was said, did not finish the reply,
            # whatever its finish reason: the reply stays as it was, cut off (``llm.continuation``).
            logger.info("turn %s: continuation %s added nothing", ctx.turn.pk, going.continuations)
            return StreamedStep(text=said, continuations=going.continuations, truncated=True)
        text = news
    going.parts.append(text)
    return StreamedStep(text="".join(going.parts), calls=calls, continuations=going.continuations)


def _released(news: str, *, held: bool) -> Iterator[TurnEvent]:
    """The held-back text of a continuation that has ended, when it added something."""
    if held and news:
        yield {"type": "delta", "text": news}


def prompt_inputs(ctx: TurnContext, specs: list[Any], tool_messages: list[Message]) -> PromptInputs:
    # The window plus any turns that left it but are not in the summary yet: the builder keeps those
    # when they fit and degrades them (visibly) when they do not.
    session, retrieved = ctx.session, ctx.retrieved
    memories = []
    procedural: list[str] = []
    if retrieved is not None:
        memories = [
            MemoryItem(id=item.memory.pk, text=item.text, score=float(item.score), kind=item.memory.kind)
            for item in retrieved.items
        ]
        procedural = [m.text for m in retrieved.procedural]
    return PromptInputs(
        system_prompt=ctx.agent.system_prompt,
        # What a TOOL_ERROR means, wherever a tool of the agent's is offered (the hand-off alone needs none; the
        # agent's tools are optional when the decision travels inside the reply, and still tools).
        fixed_instructions=TOOL_ERROR_POLICY if any(spec.name != HANDOFF_TOOL.name for spec in specs) else "",
        workflow_text=ctx.workflow.resume_instruction(session.state, session.data, refused=ctx.refused),
        procedural=procedural,
        memories=memories,
        summary=session.summary,
        recent_turns=ctx.history.for_prompt if ctx.history is not None else [],
        summary_through_seq=session.summary_through_seq,
        message=ctx.turn.user_message,
        tool_messages=list(tool_messages),
        tools=[spec.as_openai() for spec in specs],
    )


def _handoff_reason(calls: list[ToolCallRequest]) -> str:
    call = next(c for c in calls if c.name == HANDOFF_TOOL.name)
    try:
        reason = json.loads(call.arguments or "{}").get("reason")
    except (ValueError, AttributeError):
        reason = None
    return str(reason or "the user asked for a person")[:300]


def _apply_action(ctx: TurnContext, result: Any, context: ToolContext) -> bool:
    """Move the workflow by the outcome of its action state's tool, recording the call with it; True when a
    transition was applied.

    Success: the decision for the success state, with the slots the tool's structured output sets, written in
    one transaction with the call's ``ToolInvocation`` (a connection lost before it commits loses neither
    alone: the recovered turn calls the idempotent action again, and writes both). Failure: the call recorded,
    counted as a failed attempt (after the retry limit the session moves to its failed state)."""
    session, workflow = ctx.session, ctx.workflow
    success_state, _failure_state = workflow.action_outcomes[session.state]
    if not result.ok:
        record_invocation(result, context)
        turn_failure_record(session=session, turn=None, reason=f"{result.name} failed ({result.error_kind or 'error'})")
        ctx.reload()
        return False
    try:
        decision = workflow.decision(
            next_state=success_state, slots=workflow.action_slots(result.data), reasoning=f"{result.name} succeeded"
        )
        # The session as written (mirrored by ``transition_apply``); its checkpoint stands for the next call.
        outcome = transition_apply(
            session=session, turn=ctx.turn, decision=decision, also=lambda: tool_invocation_insert(result, context)
        )
    except BaseException:
        # The outcome was not written (a stale session, slots the workflow refuses, a lost connection): the call
        # ran all the same, so it is recorded on its own, then the turn fails as any turn does.
        record_invocation(result, context)
        raise
    ctx.checkpoint_fresh = outcome.checkpoint is not None
    return True


def _at_step_limit(ctx: TurnContext, reply_parts: list[str]) -> Iterator[TurnEvent]:
    session, turn, agent = ctx.session, ctx.turn, ctx.agent
    behaviour = agent.step_limit_behaviour
    note = f"I stopped after {agent.step_limit} steps without finishing."
    mark_step_limit(turn, limit=agent.step_limit)
    ctx.done = True
    if behaviour == "handoff":
        yield from handoff(ctx, reason=f"step limit {agent.step_limit} reached")
        return
    if behaviour == "partial":
        partial = "\n\n".join(reply_parts).strip()
        text = (
            f"{partial}\n\n({note} This is a partial answer.)"
            if partial
            else f"{note} Here is what I have: nothing conclusive yet."
        )
        complete_turn(
            session,
            turn,
            reply=text,
            steps=agent.step_limit,
            composition={"step_limit_hit": True},
            retrieval={},
            prompt_tokens=0,
            is_demo=False,
            resets_failures=ctx.workflow.is_free_chat,
        )
        yield {"type": "delta", "text": f"\n\n({note})"}
        yield done_event(turn, session)
        return
    message = f"{note} Please rephrase or try again."
    fail_turn(session, turn, reason=f"step limit {agent.step_limit} reached", reply=message)
    ctx.reload()
    yield error_event("step_limit", message, turn)
