"""The Prometheus totals: all-time counters and histogram buckets per agent, for the /metrics exporter."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce

from agents.models import Agent, LLMCall, ToolInvocation
from observability.models import MetricTotals
from observability.selectors.indicators import checkpoint_aggregates, tool_aggregates, turn_aggregates
from sessions.models import Checkpoint, Turn
from sessions.selectors import summaries_waiting

# All-time counters and histogram buckets per agent. Rows older than METRICS_SEAL_AFTER no longer change
# (a turn is finished within minutes, the logs are append-only), so their totals are summed once and kept in
# a row of MetricTotals with the hour they reach up to (the seal, on the database's clock); a scrape adds only
# the rows after the seal, an index range of an hour or two. Summing every row on every scrape took 0.5 s at a
# million rows a table, every 15 s per Prometheus server. Deleted rows are made up for by an offset, so a
# counter never goes down (_never_lower); only deleting the kept row (a recount) can lower one. A turn
# finished more than an hour after it started (resumed late by the sweep) is counted without its step-limit
# and degradation marks.
METRICS_SEAL_AFTER = dt.timedelta(hours=1)
_SEALED_KEY = "v1"

# name -> (LLMCall field, upper bounds of the buckets, scale of the field per bound unit)
HistogramSpec = tuple[str, tuple[float, ...], float]


def _add(totals: dict[Any, dict[str, Any]], key: Any, values: dict[str, Any]) -> None:
    """Add ``values`` (numbers, or lists of bucket counts) to ``totals[key]``, in place."""
    bucket = totals.setdefault(key, {})
    for name, value in values.items():
        if isinstance(value, list):
            previous = bucket.get(name) or [0] * len(value)
            bucket[name] = [a + b for a, b in zip(previous, value, strict=True)]
        else:
            bucket[name] = bucket.get(name, 0) + (value or 0)


def _merge(into: dict[Any, dict[str, Any]], more: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """A new sum of two sets of totals (neither is changed)."""
    out = {key: dict(values) for key, values in into.items()}
    for key, values in more.items():
        _add(out, key, values)
    return out


def _totals_between(
    *, since: dt.datetime | None, before: dt.datetime | None, histograms: dict[str, HistogramSpec]
) -> dict[int | None, dict[str, Any]]:
    """Counters and histogram buckets per agent id over the rows with ``since <= created_at < before``."""
    window: dict[str, dt.datetime] = {}
    if since is not None:
        window["created_at__gte"] = since
    if before is not None:
        window["created_at__lt"] = before
    totals: dict[int | None, dict[str, Any]] = {}

    buckets = {
        f"{name}__le_{i}": Count("id", filter=Q(**{f"{field}__lte": bound * scale}))
        for name, (field, bounds, scale) in histograms.items()
        for i, bound in enumerate(bounds)
    }
    for row in (
        LLMCall.objects.filter(**window)
        .order_by()
        .values("agent_id")
        .annotate(
            calls=Count("id"),
            calls_retried=Count("id", filter=Q(retries__gt=0)),
            retries=Coalesce(Sum("retries"), 0),
            # Not named after the field: the buckets' filters read the field.
            prompt_tokens_sum=Coalesce(Sum("prompt_tokens"), 0),
            ttft_count=Count("ttft_ms"),
            ttft_sum_ms=Coalesce(Sum("ttft_ms"), 0.0),
            **buckets,
        )
    ):
        agent_id = row.pop("agent_id")
        row["prompt_tokens"] = row.pop("prompt_tokens_sum")
        for name, (_, bounds, _) in histograms.items():
            row[name] = [int(row.pop(f"{name}__le_{i}")) for i in range(len(bounds))]
        _add(totals, agent_id, row)
    for model, aggregates in (
        (Turn, turn_aggregates()),
        (Checkpoint, checkpoint_aggregates()),
        (ToolInvocation, tool_aggregates()),
    ):
        for row in model.objects.filter(**window).order_by().values("session__agent_id").annotate(**aggregates):
            _add(totals, row.pop("session__agent_id"), row)
    return totals


def _metrics_state_key(histograms: dict[str, HistogramSpec]) -> str:
    # One kept state per set of histograms (a digest, short).
    return f"{_SEALED_KEY}:{hashlib.sha256(repr(sorted(histograms.items())).encode()).hexdigest()[:16]}"


def _by_agent_from_json(pairs: Any) -> dict[int | None, dict[str, Any]]:
    return {agent: dict(values) for agent, values in pairs} if isinstance(pairs, list) else {}


def _by_agent_to_json(by_agent: dict[int | None, dict[str, Any]]) -> list[list[Any]]:
    # JSON objects have string keys only: agent ids (and None) travel as pairs.
    return [[agent, values] for agent, values in by_agent.items()]


def _kept_state(key: str) -> dict[str, Any]:
    """The kept state (seal, sealed totals, offsets, last exposed values), or nothing to start from."""
    row = MetricTotals.objects.filter(key=key).first()
    if row is None or not isinstance(row.state, dict):
        return {}
    return {
        "seal": row.sealed_before,
        "sealed": _by_agent_from_json(row.state.get("sealed")),
        "offset": _by_agent_from_json(row.state.get("offset")),
        "floor": _by_agent_from_json(row.state.get("floor")),
    }


def _sealed_totals(
    state: dict[str, Any], seal: dt.datetime, histograms: dict[str, HistogramSpec]
) -> dict[int | None, dict[str, Any]]:
    """The totals of the rows before ``seal``: the kept ones, topped up by the rows since their seal, or summed
    in full when none are kept (or they are past ``seal``: the database's clock went back)."""
    kept_seal, kept = state.get("seal"), state.get("sealed")
    if kept is not None and kept_seal == seal:
        return dict(kept)
    if kept is not None and kept_seal is not None and kept_seal < seal:
        return _merge(kept, _totals_between(since=kept_seal, before=seal, histograms=histograms))
    return _totals_between(since=None, before=seal, histograms=histograms)


def _never_lower(
    current: dict[int | None, dict[str, Any]], state: dict[str, Any]
) -> tuple[dict[int | None, dict[str, Any]], dict[int | None, dict[str, Any]]]:
    """Counters as exposed: the current totals plus an offset that grows by whatever they fell below the last
    exposed values (deleted rows). Prometheus reads any drop as a restart from zero, and its ``rate()`` then
    counts the whole value again: one deleted chat was a spike of a million turns on the graphs."""
    offsets, floor = state.get("offset", {}), state.get("floor", {})
    exposed: dict[int | None, dict[str, Any]] = {}
    new_offsets: dict[int | None, dict[str, Any]] = {}
    for agent, values in current.items():
        shown: dict[str, Any] = {}
        kept: dict[str, Any] = {}
        # A figure whose rows are all gone (every tool run deleted) is still shown, at its floor.
        missing = {name: [0] * len(low) if isinstance(low, list) else 0 for name, low in floor.get(agent, {}).items()}
        for name, value in {**missing, **values}.items():
            low = floor.get(agent, {}).get(name)
            offset: Any = offsets.get(agent, {}).get(name)
            total: Any
            if isinstance(value, list):
                offset = offset if isinstance(offset, list) and len(offset) == len(value) else [0] * len(value)
                total = [v + o for v, o in zip(value, offset, strict=True)]
                if isinstance(low, list) and len(low) == len(total):
                    gap = [max(0, lo - t) for lo, t in zip(low, total, strict=True)]
                    offset = [o + g for o, g in zip(offset, gap, strict=True)]
                    total = [t + g for t, g in zip(total, gap, strict=True)]
            else:
                offset = offset if isinstance(offset, (int, float)) else 0
                total = value + offset
                if isinstance(low, (int, float)) and total < low:
                    offset, total = offset + (low - total), low
            shown[name], kept[name] = total, offset
        exposed[agent], new_offsets[agent] = shown, kept
    return exposed, new_offsets


# One scrape at a time reads and writes the kept state (two at once would both add the same offset, or both
# create its row).
_METRICS_LOCK = 0x6D65747269637331  # "metrics1"


def metric_totals_by_agent(
    *, histograms: dict[str, HistogramSpec] | None = None, now: dt.datetime | None = None
) -> dict[str, dict[str, Any]]:
    """All-time counters per agent slug ("none" for rows without an agent), for the /metrics exporter, with
    each histogram of ``histograms`` as a list of cumulative bucket counts under its name, and the sessions
    waiting for a summary (a gauge, read live). The counters never go down (``_never_lower``)."""
    histograms = histograms or {}
    if now is None:
        # The database's clock, shared by every process: a process whose own clock ran ahead would store a
        # seal in the future, and the rows before it would be counted by no one.
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            now = cursor.fetchone()[0]
    seal = (now - METRICS_SEAL_AFTER).replace(minute=0, second=0, microsecond=0)
    key = _metrics_state_key(histograms)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_METRICS_LOCK])
        state = _kept_state(key)
        sealed = _sealed_totals(state, seal, histograms)
        current = _merge(sealed, _totals_between(since=seal, before=None, histograms=histograms))
        slugs = dict(Agent.objects.values_list("id", "slug"))
        # An agent whose rows are all deleted keeps its figures; a deleted agent's calls now count under "none".
        for agent in state.get("floor", {}):
            if agent is None or agent in slugs:
                current.setdefault(agent, {})
        by_agent, offsets = _never_lower(current, state)
        MetricTotals.objects.update_or_create(
            key=key,
            defaults={
                "sealed_before": seal,
                "state": {
                    "sealed": _by_agent_to_json(sealed),
                    "offset": _by_agent_to_json(offsets),
                    "floor": _by_agent_to_json(by_agent),
                },
            },
        )
    pending = summaries_waiting().order_by().values("agent_id").annotate(summaries_pending=Count("id"))
    by_slug: dict[str, dict[str, Any]] = {}
    for agent_id, values in by_agent.items():
        _add(by_slug, slugs.get(agent_id, "none") if agent_id is not None else "none", values)
    for row in pending:
        agent_id = row["agent_id"]
        _add(by_slug, slugs.get(agent_id, "none"), {"summaries_pending": row["summaries_pending"]})
    return by_slug
