"""Progressive summaries: the turns that leave the sliding window are folded into a running summary.

- ``requests``: ``summary_request_if_due`` runs after every turn and asks for a summary a little before turns
  leave the window (``SUMMARY_LEAD_TURNS``), in batches (``SUMMARY_BATCH_TURNS``), so the next call normally
  finds it ready; when it is not, the context builder keeps the unsummarized turns and degrades if they do not
  fit. ``summaries_requeue`` sends again the requests whose task was lost (the outbox sweep);
- ``summarize``: the Celery task ``web.tasks.sessions.summarize_session`` calls ``summarize_session_through``,
  which asks the (cheap) model to merge the new turns into the summary — keeping decisions, facts, actions and
  pending items, dropping filler — bounded by the summary section budget;
- ``extractive``: when the model fails, ``extractive_summary`` keeps the summary bounded without it; a model's
  summary keeps what the user stated (``with_stated_facts``).
"""

from __future__ import annotations

from sessions.summaries.extractive import (
    EXTRACT_LINE_TOKENS,
    QUOTED_CHARS,
    STATED_FACT_SCORE,
    STATED_FACTS_LOOKBACK_TURNS,
    STATED_FACTS_SHARE,
    extractive_summary,
    stated_facts,
    with_stated_facts,
)
from sessions.summaries.requests import (
    SUMMARY_LOOKBACK,
    SUMMARY_LOST_AFTER,
    SUMMARY_REQUEUE_AGAIN_AFTER,
    SUMMARY_TASK,
    checked_turns,
    newest_turns,
    summaries_requeue,
    summary_due,
    summary_request_if_due,
)
from sessions.summaries.summarize import SUMMARIZE_INSTRUCTIONS, summarize_session_through, summarize_turns

__all__ = [
    "EXTRACT_LINE_TOKENS",
    "QUOTED_CHARS",
    "STATED_FACTS_LOOKBACK_TURNS",
    "STATED_FACTS_SHARE",
    "STATED_FACT_SCORE",
    "SUMMARIZE_INSTRUCTIONS",
    "SUMMARY_LOOKBACK",
    "SUMMARY_LOST_AFTER",
    "SUMMARY_REQUEUE_AGAIN_AFTER",
    "SUMMARY_TASK",
    "checked_turns",
    "extractive_summary",
    "newest_turns",
    "stated_facts",
    "summaries_requeue",
    "summarize_session_through",
    "summarize_turns",
    "summary_due",
    "summary_request_if_due",
    "with_stated_facts",
]
