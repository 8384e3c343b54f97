from __future__ import annotations

from django.db import migrations

# The defaults from the issue; operators change thresholds in the admin.
DEFAULT_RULES = [
    {
        "name": "Retry rate above 10% over 15 minutes",
        "metric": "retry_rate",
        "threshold": 0.10,
        "window_minutes": 15,
        "min_samples": 10,
        "enabled": True,
        "description": "Share of model calls that needed at least one retry (seed pattern 1: retry spikes).",
    },
    {
        "name": "Prompt tokens per call up 30% in an hour",
        "metric": "tokens_growth",
        "threshold": 0.30,
        "window_minutes": 60,
        "min_samples": 10,
        "enabled": True,
        "description": "Mean prompt tokens per call in the last hour against the hour before: context creeping up.",
    },
    {
        "name": "More than 5 FSM resets in 10 minutes",
        "metric": "fsm_resets",
        "threshold": 5,
        "window_minutes": 10,
        "min_samples": 1,
        "enabled": True,
        "description": "Sessions reset to their initial state: workflows going round in circles.",
    },
    {
        "name": "Time to first token p95 above 8 s over 15 minutes",
        "metric": "ttft_p95",
        "threshold": 8000,
        "window_minutes": 15,
        "min_samples": 10,
        "enabled": True,
        "description": "Slow first tokens usually mean oversized prompts or an overloaded endpoint.",
    },
    {
        "name": "Tool error rate above 25% over 15 minutes",
        "metric": "tool_error_rate",
        "threshold": 0.25,
        "window_minutes": 15,
        "min_samples": 10,
        "enabled": True,
        "description": "Share of tool runs that returned TOOL_ERROR.",
    },
    {
        "name": "More than 3 sessions FAILED in 15 minutes",
        "metric": "failed_sessions",
        "threshold": 3,
        "window_minutes": 15,
        "min_samples": 1,
        "enabled": True,
        "description": "Sessions that exhausted their retries and moved to FAILED.",
    },
    {
        "name": "More than 10 step-limit hits in 30 minutes",
        "metric": "step_limit_hits",
        "threshold": 10,
        "window_minutes": 30,
        "min_samples": 1,
        "enabled": False,
        "description": "Turns cut off by the tool-loop step limit.",
    },
]


def seed(apps, schema_editor):
    AlertRule = apps.get_model("observability", "AlertRule")
    for rule in DEFAULT_RULES:
        AlertRule.objects.get_or_create(name=rule["name"], defaults=rule)


def unseed(apps, schema_editor):
    AlertRule = apps.get_model("observability", "AlertRule")
    AlertRule.objects.filter(name__in=[r["name"] for r in DEFAULT_RULES]).delete()


class Migration(migrations.Migration):
    dependencies = [("observability", "0001_initial")]

    operations = [migrations.RunPython(seed, unseed)]
