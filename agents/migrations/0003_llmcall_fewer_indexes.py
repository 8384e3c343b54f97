# Fewer indexes to write on every model call: the agent's own index is covered by llmcall_agent_time
# (agent, created_at), and purpose and outcome keep a plain btree without the LIKE twin.

import django.db.models.deletion
from django.db import migrations, models

from core.index_ops import DropFieldIndexes


class Migration(migrations.Migration):
    # The indexes are dropped (and kept ones built, where missing) without blocking a live table.
    atomic = False

    dependencies = [
        ("agents", "0002_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                DropFieldIndexes(
                    [
                        ("agents_llmcall", "agent_id", False),
                        ("agents_llmcall", "purpose", True),
                        ("agents_llmcall", "outcome", True),
                    ],
                    keep={
                        ("agents_llmcall", "purpose"): "llmcall_purpose",
                        ("agents_llmcall", "outcome"): "llmcall_outcome",
                    },
                ),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="llmcall",
                    name="agent",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="calls",
                        to="agents.agent",
                    ),
                ),
                migrations.AlterField(model_name="llmcall", name="outcome", field=models.CharField(max_length=20)),
                migrations.AlterField(model_name="llmcall", name="purpose", field=models.CharField(max_length=20)),
                migrations.AddIndex(
                    model_name="llmcall", index=models.Index(fields=["purpose"], name="llmcall_purpose")
                ),
                migrations.AddIndex(
                    model_name="llmcall", index=models.Index(fields=["outcome"], name="llmcall_outcome")
                ),
            ],
        ),
    ]
