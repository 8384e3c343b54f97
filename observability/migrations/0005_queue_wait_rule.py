from __future__ import annotations

from django.db import migrations, models

# Background work five minutes behind: memory writes and summaries arrive late, recovery and alerts may too.
QUEUE_RULE = {
    "name": "Background tasks waiting more than 5 minutes",
    "metric": "queue_wait",
    "threshold": 300,
    "window_minutes": 1,
    "min_samples": 1,
    "per_agent": False,
    "enabled": True,
    "description": "The oldest task waiting in the default or the operations queue (Redis-protocol brokers only): "
    "workers too few or stuck.",
}


def seed(apps, schema_editor):
    AlertRule = apps.get_model("observability", "AlertRule")
    AlertRule.objects.get_or_create(name=QUEUE_RULE["name"], defaults=QUEUE_RULE)


def unseed(apps, schema_editor):
    AlertRule = apps.get_model("observability", "AlertRule")
    AlertRule.objects.filter(name=QUEUE_RULE["name"]).delete()


class Migration(migrations.Migration):
    dependencies = [("observability", "0004_metric_totals")]

    operations = [
        migrations.AlterField(
            model_name="alertrule",
            name="metric",
            field=models.CharField(
                choices=[
                    ("retry_rate", "Share of calls that needed a retry"),
                    ("retries_per_call", "Retries per call"),
                    ("tokens_growth", "Prompt tokens per call: growth vs the previous window"),
                    ("fsm_resets", "FSM resets (count)"),
                    ("failed_sessions", "Sessions moved to FAILED (count)"),
                    ("ttft_p95", "Time to first token, p95 (ms)"),
                    ("tool_error_rate", "Share of tool runs that returned TOOL_ERROR"),
                    ("step_limit_hits", "Turns that hit the step limit (count)"),
                    ("degradations", "Turns whose context was degraded (count)"),
                    ("summaries_pending", "Sessions waiting for a summary (count, now)"),
                    ("queue_wait", "Background queues: how long the oldest waiting task has waited (s, now)"),
                ],
                max_length=30,
            ),
        ),
        migrations.RunPython(seed, unseed),
    ]
