"""The cheap model's calls in retrieval: one structured call abandoned past its time budget, the batched
relevance scores of tier 3, and whether a cheap model is there to call at all."""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connection, connections

from llm.base import CallContext
from llm.providers import agent_profile, get_provider
from memory.models import Memory
from memory.retrieval import tuning
from memory.schemas import RankedMemories, RelevanceScores

if TYPE_CHECKING:
    from agents.models import Agent
    from llm.base import Purpose, SchemaT

RELEVANCE_SYSTEM_PROMPT = (
    "You judge which stored memories help answer the user's message. Score every memory id from 0.0 "
    "(unrelated) to 1.0 (needed to answer). Facts about the user that the reply should respect count as "
    "relevant. Return one score per id and nothing else."
)

RERANK_SYSTEM_PROMPT = (
    "You order stored memories by how much each one helps answer the user's message. Answer with the numbers "
    "of the memories that help, most helpful first, and leave out the ones that do not help. Facts about the "
    "user that the reply should respect help."
)


def cheap_structured(
    *,
    agent: Agent | None,
    messages: list[dict[str, Any]],
    schema: type[SchemaT],
    purpose: Purpose,
    max_tokens: int,
    timeout: float,
) -> SchemaT:
    """One structured call to the cheap model, abandoned past ``timeout`` seconds (raises
    ``concurrent.futures.TimeoutError``; any provider error is raised too)."""
    provider = get_provider(agent=agent, cheap=True)
    ctx = CallContext(purpose=purpose, agent_id=agent.pk if agent else None)

    # The call runs in a worker thread (so it can be abandoned past its time budget) and writes its
    # LLMCall record there. Outside a transaction the thread uses (and closes) its own connection; inside
    # one (a caller's atomic block, or a test) it borrows the caller's, so the record belongs to the same
    # transaction instead of being committed on the side.
    caller = connections[DEFAULT_DB_ALIAS]
    shared = caller if caller.in_atomic_block else None
    if shared is not None:
        shared.inc_thread_sharing()

    def call() -> SchemaT:
        try:
            if shared is not None:
                connections[DEFAULT_DB_ALIAS] = shared
            return provider.structured(messages, schema=schema, ctx=ctx, max_tokens=max_tokens)
        finally:
            if shared is not None:
                shared.dec_thread_sharing()
            else:
                connection.close()

    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=purpose)
    try:
        return executor.submit(call).result(timeout=timeout)
    finally:
        executor.shutdown(wait=False)


def model_scores(*, agent: Agent | None, query: str, memories: list[Memory], timeout: float) -> dict[int, float]:
    """One batched cheap-model call scoring all candidates; raises on error or when over the time budget."""
    messages = _judge_prompt(RELEVANCE_SYSTEM_PROMPT, query, [(m.id, m) for m in memories])
    result = cheap_structured(
        agent=agent,
        messages=messages,
        schema=RelevanceScores,
        purpose="relevance",
        max_tokens=20 + 12 * len(memories),
        timeout=timeout,
    )
    wanted = {m.id for m in memories}
    return {s.id: s.score for s in result.scores if s.id in wanted}


def _judge_prompt(system: str, query: str, labelled: list[tuple[int, Memory]]) -> list[dict[str, Any]]:
    """A judge's messages: the query, then each memory after its label in brackets."""
    listing = "\n".join(f"[{label}] {m.text[: tuning.MODEL_FILTER_CHARS]}" for label, m in labelled)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"User message:\n{query}\n\nMemories:\n{listing}"},
    ]


def rerank_prompt(query: str, memories: list[Memory]) -> list[dict[str, Any]]:
    """The listwise reranker's messages: the memories numbered from 1 (small numbers, not database ids: a small
    model copies them back more reliably)."""
    return _judge_prompt(RERANK_SYSTEM_PROMPT, query, list(enumerate(memories, start=1)))


def model_order(
    *, agent: Agent | None, messages: list[dict[str, Any]], memories: list[Memory], timeout: float
) -> list[int]:
    """One listwise cheap-model call: the ids of the memories it says help, most helpful first (numbers out of
    range and repeats are dropped); raises on error or when over the time budget."""
    result = cheap_structured(
        agent=agent,
        messages=messages,
        schema=RankedMemories,
        purpose="relevance",
        max_tokens=24 + 6 * len(memories),  # "[12, 3, ..." with the spaces and line breaks small models add
        timeout=timeout,
    )
    order: list[int] = []
    for number in result.order:
        if 1 <= number <= len(memories) and memories[number - 1].id not in order:
            order.append(memories[number - 1].id)
    return order


def cheap_model_configured(agent: Agent | None) -> bool:
    """A cheap model is named for the agent's endpoint (``LLM_CHEAP_MODEL`` or the profile's ``cheap_model``):
    the query rewrite is one more call before the reply, worth it only on a fast, cheap model."""
    try:
        profile = agent_profile(agent)
    except Exception:  # noqa: BLE001 - a misconfigured endpoint is reported by the turn's own provider lookup
        return False
    return profile is not None and bool(profile.cheap_model)


def model_filter_available(agent: Agent | None) -> bool:
    return not get_provider(agent=agent, cheap=True).is_demo


def cheap_model_key(agent: Agent | None) -> str:
    """Which endpoint and model the cheap calls of ``agent`` go to (to keep their pace apart)."""
    provider = get_provider(agent=agent, cheap=True)
    profile = getattr(provider, "profile", None)
    return f"{getattr(profile, 'base_url', '')} {getattr(provider, 'model', '')}"
