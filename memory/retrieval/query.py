"""The query: what to search the memories for (the message, with the user's earlier ones or rewritten by
the cheap model), and its vector, computed on another thread while tier 1 and the word arm are read."""

from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings

from core.db import release_connection
from memory.embedding import embed_query_soon
from memory.retrieval import tuning
from memory.retrieval.cheap import cheap_model_configured, cheap_structured
from memory.retrieval.words import query_terms
from memory.schemas import SearchQuery

if TYPE_CHECKING:
    from agents.models import Agent

logger = logging.getLogger(__name__)

QUERY_REWRITE_PROMPT = (
    "Rewrite the user's newest message as one standalone search query for their stored memories: resolve "
    "what 'it', 'there', 'that' and the like refer to from their earlier messages, keep names, places, dates "
    "and the topic, drop greetings. Answer with the query only, in the user's language."
)


@dataclass(frozen=True)
class RetrievalQuery:
    text: str
    source: str  # "message" (the message alone), "conversation" (with earlier messages), "rewrite" (cheap model)


def retrieval_query(*, message: str, earlier: list[str], agent: Agent | None = None) -> RetrievalQuery:
    """What to search the memories for: the new message, with the user's ``earlier`` messages (oldest
    first) so a follow-up ("and when was that?") still finds its topic; rewritten by the cheap model into
    a standalone query when one is configured (one short call, within MEMORY_RELEVANCE_TIMEOUT; any
    failure keeps the message with its context). Without a cheap model, a short message (a follow-up, under
    QUERY_STANDALONE_WORDS words) is searched with its context, the message first; a longer one alone."""
    context = [t.strip() for t in earlier if t.strip()][-tuning.QUERY_CONTEXT_TURNS :]
    if not context:
        return RetrievalQuery(message, "message")
    whole = " ".join(context)
    joined = whole[-tuning.QUERY_CONTEXT_CHARS :]
    if len(whole) > len(joined) and not whole[-len(joined) - 1].isspace() and " " in joined:
        joined = joined.split(" ", 1)[1]  # from a word's start, not the middle of one
    if cheap_model_configured(agent):
        listing = "\n".join(f"- {t[: tuning.QUERY_CONTEXT_CHARS]}" for t in context)
        messages = [
            {"role": "system", "content": QUERY_REWRITE_PROMPT},
            {"role": "user", "content": f"Earlier messages:\n{listing}\n\nNewest message:\n{message}"},
        ]
        try:
            rewritten = cheap_structured(
                agent=agent,
                messages=messages,
                schema=SearchQuery,
                purpose="query",
                max_tokens=80,
                timeout=float(settings.MEMORY_RELEVANCE_TIMEOUT),
            ).query.strip()
            if rewritten:
                return RetrievalQuery(rewritten, "rewrite")
        except Exception as exc:  # noqa: BLE001 - the rewrite is an aid: any failure keeps the plain query
            logger.warning("query rewrite failed; searching the message with its context: %s", exc)
    elif len(query_terms(message)) >= tuning.QUERY_STANDALONE_WORDS:
        # Without a model, a message of a sentence or more stands on its own: the earlier ones only blur it
        # (bench/memory_eval.py's conversational corpus lost recall@10 with them added to every query).
        return RetrievalQuery(message, "message")
    return RetrievalQuery(f"{message}\n{joined}", "conversation")


def query_vector_soon(query: str, query_vector: list[float] | None) -> concurrent.futures.Future[list[float]] | None:
    """The query's vector, on its way: computed on another thread (the model and the database both let go of
    the GIL), or ``query_vector`` when the caller has it already; None for a blank query (no vector)."""
    pending: concurrent.futures.Future[list[float]] | None = None
    if query_vector is not None:
        pending = concurrent.futures.Future()
        pending.set_result(query_vector)
    elif query.strip():
        pending = embed_query_soon(query)
    return pending


def query_vector_wait(pending: concurrent.futures.Future[list[float]]) -> tuple[list[float] | None, str]:
    """The query's vector and "" or, when it could not be embedded in time, None and why (for the report).

    Bounded by ``EMBEDDING_QUERY_WAIT``: an embedder that stalls (a stopped embedding service, an endpoint that
    does not answer) costs a turn that long, never its answer. A query that cannot be embedded is searched by its
    words alone (with the profile facts and pinned memories of tier 1), and the report says so. A wait longer than
    a moment holds no database connection: this thread's goes back first (``core.db.release_connection``), so
    turns waiting on a stalled embedder never starve the others of connections."""
    wait = float(getattr(settings, "EMBEDDING_QUERY_WAIT", 5.0))
    try:
        try:
            return pending.result(timeout=min(0.05, wait)), ""
        except concurrent.futures.TimeoutError:
            release_connection()
            return pending.result(timeout=max(0.0, wait - 0.05)), ""
    except Exception as exc:  # noqa: BLE001 - retrieval degrades to the word arm, never fails for this
        waited_out = isinstance(exc, concurrent.futures.TimeoutError) and not pending.done()
        reason = "it took longer than EMBEDDING_QUERY_WAIT" if waited_out else ""
        logger.warning("query embedding failed (%s): searching by words alone", reason or type(exc).__name__)
        return None, f"words only: the query could not be embedded ({reason or type(exc).__name__})"
