"""Logs, /metrics, alerts and traces (the observability app)."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from core.env import env_bool, env_choice, env_float, env_int, env_str

# --- Observability: JSON logs, /metrics, alerts, traces (observability app) ----------------
LOG_FORMAT = env_str("LOG_FORMAT", "json") or "json"
if LOG_FORMAT not in {"json", "plain"}:
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r} must be json or plain")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Both formatters add the bound session/turn ids (observability.logging.bind_log_context).
    "formatters": {
        "json": {"()": "observability.logging.JsonFormatter"},
        "plain": {"()": "observability.logging.PlainFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    # httpx logs every request at INFO: the health monitor's GET /ready to the embedding service (4-8 a second while
    # a page is open) and each model call were 80 % of make run's log. Calls are recorded (LLMCall) and traced.
    # Celery's beat logs a line at INFO for every task it sends ("Scheduler: Sending due task ...": the heartbeat,
    # the sweeps, several a minute): its warnings and errors stay.
    "loggers": {
        "httpx": {"level": env_choice("HTTPX_LOG_LEVEL", "WARNING", ("DEBUG", "INFO", "WARNING", "ERROR"))},
        "celery.beat": {"level": env_choice("BEAT_LOG_LEVEL", "WARNING", ("DEBUG", "INFO", "WARNING", "ERROR"))},
    },
    "root": {
        "handlers": ["console"],
        "level": env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL")),
    },
}
# /metrics: a bearer token, or (METRICS_ALLOW_INTERNAL) any loopback/private client. Neither: loopback only.
METRICS_TOKEN = env_str("METRICS_TOKEN", "") or ""
METRICS_ALLOW_INTERNAL = env_bool("METRICS_ALLOW_INTERNAL", False)
# Alert rules live in the database (admin); these are the defaults the seed migration and new rules use.
ALERT_WEBHOOK_URL = env_str("ALERT_WEBHOOK_URL", "") or ""
ALERT_WEBHOOK_TIMEOUT = env_float("ALERT_WEBHOOK_TIMEOUT", 5.0, minimum=0.1)
# Too few calls in a window say nothing: a rate alert needs at least this many samples.
ALERT_MIN_SAMPLES = env_int("ALERT_MIN_SAMPLES", 10, minimum=1)
# Traces: OTLP/HTTP to this collector URL (e.g. http://127.0.0.1:4318); unset = tracing off.
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "") or ""
OTEL_EXPORTER_OTLP_TIMEOUT = env_float("OTEL_EXPORTER_OTLP_TIMEOUT", 5.0, minimum=0.1)
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "agent-runtime") or "agent-runtime"
