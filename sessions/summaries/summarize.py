"""The summarization itself: the turns that leave the sliding window folded into the session's running summary.

The Celery task ``web.tasks.sessions.summarize_session`` calls ``summarize_session_through``, which asks the
(cheap) model to merge the new turns into the summary — keeping decisions, facts, actions and pending items,
dropping filler — bounded by the summary section budget. When the model fails, ``extractive_summary`` keeps
the summary bounded without it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from llm.base import CallContext, LLMError
from llm.prompt import ContextBudget, TurnText, cut_to_budget
from llm.providers import get_provider
from llm.tokens import TokenCounter, counter_for
from sessions.models import ChatSession, Turn
from sessions.summaries.extractive import STATED_FACTS_LOOKBACK_TURNS, extractive_summary, with_stated_facts

if TYPE_CHECKING:
    from llm.base import LLMProvider

# The name summaries have always logged under.
logger = logging.getLogger(__name__)

SUMMARIZE_INSTRUCTIONS = """You maintain the running summary of a conversation between a user and an assistant.
Merge the existing summary and the new turns into one updated summary.
Keep: decisions made; facts about the user and the task (names, numbers, dates, places, references, preferences);
actions taken (tool calls, bookings) and their results; pending items and open questions.
Drop: greetings, thanks, small talk, filler and repetition.
Put decisions and facts first. Write short bullet lines ("- ..."). Never invent anything.
Use at most {limit} tokens. Answer with the summary only."""


def summarize_session_through(
    *, session_id: uuid.UUID | str, through_seq: int, provider: LLMProvider | None = None
) -> bool:
    """Fold the completed turns up to ``through_seq`` into the session's summary. Idempotent.

    Uses the agent's cheap model (temperature 0); on an ``LLMError`` (a cut-off reply included) falls
    back to ``extractive_summary``. The summary and ``summary_through_seq`` are stored with a
    conditional update, so they never move backwards. Returns whether the summary was updated.
    No transaction is held during the model call.
    """
    session = ChatSession.objects.select_related("agent").filter(pk=session_id).first()
    if session is None or session.summary_through_seq >= through_seq:
        return False
    turns = list(
        Turn.objects.filter(
            session=session,
            status=Turn.Status.COMPLETED,
            seq__gt=session.summary_through_seq,
            seq__lte=through_seq,
        )
        .order_by("seq")
        .values_list("seq", "user_message", "assistant_message")
    )
    if not turns:
        return False
    texts = [TurnText(seq=s, user=u, assistant=a) for s, u, a in turns]
    new_through = texts[-1].seq
    budget = ContextBudget.from_agent(session.agent)
    limit = budget.section_limit("summary")
    if provider is None:
        try:
            provider = get_provider(agent=session.agent, cheap=True)
        except LLMError as exc:
            # A misconfigured endpoint must not let the history go unsummarized: stay bounded without it.
            logger.error("no summarizer for agent %s (%s); extractive summary", session.agent_id, exc)
            summary = extractive_summary(
                previous=session.summary, turns=texts, limit=limit, counter=counter_for(session.agent.model)
            )
            return _store(session=session, summary=summary, through_seq=new_through)
    counter = counter_for(provider.model or session.agent.model)
    # The user's messages already summarized, newest first: a stated fact that a model's merge drops is added back.
    earlier = Turn.objects.filter(
        session=session, status=Turn.Status.COMPLETED, seq__lte=session.summary_through_seq
    ).order_by("-seq")[:STATED_FACTS_LOOKBACK_TURNS]
    stated = [TurnText(seq=seq, user=user, assistant="") for seq, user in earlier.values_list("seq", "user_message")]
    summary = summarize_turns(
        previous=session.summary,
        turns=texts,
        limit=limit,
        provider=provider,
        counter=counter,
        ctx=CallContext(purpose="summarize", agent_id=session.agent_id, session_id=session.pk),
        prompt_limit=budget.prompt_limit,
        earlier=stated[::-1],
    )
    return _store(session=session, summary=summary, through_seq=new_through)


def _store(*, session: ChatSession, summary: str, through_seq: int) -> bool:
    # Conditional: a slower task for fewer turns never overwrites a newer summary.
    updated = ChatSession.objects.filter(pk=session.pk, summary_through_seq__lt=through_seq).update(
        summary=summary, summary_through_seq=through_seq
    )
    return bool(updated)


def summarize_turns(
    *,
    previous: str,
    turns: Sequence[TurnText],
    limit: int,
    provider: LLMProvider,
    counter: TokenCounter,
    ctx: CallContext,
    prompt_limit: int,
    earlier: Sequence[TurnText] = (),
) -> str:
    """The previous summary merged with ``turns``, at most ``limit`` tokens: by the model, else extractive. A
    model's summary keeps what the user stated in ``turns`` and ``earlier`` (turns already summarized):
    ``with_stated_facts``."""
    instructions = SUMMARIZE_INSTRUCTIONS.format(limit=limit)
    fixed = counter.count(instructions) + counter.count(previous) + 64
    # A batch with a pasted document must still fit the summarizer's own prompt: cut each message evenly.
    per_message = max(64, (prompt_limit - limit - fixed) // max(1, 2 * len(turns)))
    transcript = "\n".join(
        f"Turn {t.seq}:\nUser: {cut_to_budget(t.user, per_message, counter)[0]}\n"
        f"Assistant: {cut_to_budget(t.assistant, per_message, counter)[0]}"
        for t in turns
    )
    messages = [
        {"role": "system", "content": instructions},
        {
            "role": "user",
            # Headers are kept to two words so an extractive summarizer (the demo model) skips them.
            "content": f"Existing summary:\n{previous.strip() or '(none yet)'}\n\nNew turns:\n{transcript}",
        },
    ]
    if counter.count_messages(messages) > prompt_limit:
        logger.warning("summary prompt over budget for turns %s-%s; extractive summary", turns[0].seq, turns[-1].seq)
        return extractive_summary(previous=previous, turns=turns, limit=limit, counter=counter)
    try:
        completion = provider.complete(messages, ctx=ctx, temperature=0, max_tokens=limit)
    except LLMError as exc:
        # TruncatedOutputError is an LLMError too: a cut-off summary is never stored as complete.
        logger.warning("summarizer failed (%s); extractive summary instead", type(exc).__name__)
        return extractive_summary(previous=previous, turns=turns, limit=limit, counter=counter)
    text = completion.text.strip()
    if not text:
        return extractive_summary(previous=previous, turns=turns, limit=limit, counter=counter)
    return with_stated_facts(text, previous=previous, turns=[*earlier, *turns], limit=limit, counter=counter)
