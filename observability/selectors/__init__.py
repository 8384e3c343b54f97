"""The death-spiral indicators, read from the records every call, checkpoint and turn leaves, one module a
kind of read.

Sources: ``agents.LLMCall`` (retries, prompt tokens, time to first token), ``agents.ToolInvocation``
(tool errors), ``chat_sessions.Checkpoint`` (resets, FAILED), ``chat_sessions.Turn`` (step-limit hits,
context degradations) and ``chat_sessions.ChatSession`` (summaries pending).

- ``indicators``: the figures over a window or per time bucket, overall or for one agent, and their trends;
- ``dashboard``: the /ops/ page's windows, active agents, summaries pending, model calls per turn;
- ``alerts``: each alert rule's metric, and the alerts fired;
- ``session_health``: one session's signals and verdict, and the sessions most at risk in a window;
- ``metric_totals``: the all-time counters of the /metrics exporter.
"""

from __future__ import annotations

from observability.selectors.alerts import (
    MetricReading,
    alert_metric_reading,
    alerts_open,
    alerts_recent,
    queue_wait_reading,
)
from observability.selectors.dashboard import (
    agents_active,
    calls_by_purpose,
    model_calls_per_turn,
    summaries_pending,
    window_choices,
)
from observability.selectors.indicators import (
    DEGRADED,
    Figures,
    Percentile,
    SeriesPoint,
    Trend,
    figure_trend,
    indicator_series,
    indicators,
    least_squares_slope,
    relative_change,
    series_trend,
)
from observability.selectors.metric_totals import METRICS_SEAL_AFTER, HistogramSpec, metric_totals_by_agent
from observability.selectors.session_health import (
    TOKENS_REACH_WINDOW_TURNS,
    SessionHealth,
    TurnHealth,
    session_health,
    sessions_at_risk,
)

__all__ = [
    "calls_by_purpose",
    "DEGRADED",
    "METRICS_SEAL_AFTER",
    "TOKENS_REACH_WINDOW_TURNS",
    "Figures",
    "HistogramSpec",
    "MetricReading",
    "Percentile",
    "SeriesPoint",
    "SessionHealth",
    "Trend",
    "TurnHealth",
    "agents_active",
    "alert_metric_reading",
    "alerts_open",
    "alerts_recent",
    "figure_trend",
    "indicator_series",
    "indicators",
    "least_squares_slope",
    "metric_totals_by_agent",
    "model_calls_per_turn",
    "queue_wait_reading",
    "relative_change",
    "series_trend",
    "session_health",
    "sessions_at_risk",
    "summaries_pending",
    "window_choices",
]
