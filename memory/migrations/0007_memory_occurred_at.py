"""``Memory.occurred_at``: when what a memory tells happened (``created_at`` stays the row's own time).

Existing rows get their ``created_at``: the episode-writing task used to store the turn's time there.
The index of tier 1's recent actions (episodes a turn wrote) and the neighbour index are built concurrently, so a live system's memory writes are not blocked.
"""

import django.utils.timezone
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("memory", "0006_fact_key_index"),
        ("chat_sessions", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="memory",
            name="occurred_at",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RunSQL(
            "UPDATE memory_memory SET occurred_at = created_at", reverse_sql=migrations.RunSQL.noop, elidable=True
        ),
        AddIndexConcurrently(
            model_name="memory",
            index=models.Index(
                condition=models.Q(kind="episodic", source_turn__isnull=False),
                fields=["user", "-created_at", "-id"],
                name="memory_user_recent_actions",
            ),
        ),
        AddIndexConcurrently(
            model_name="memory",
            index=models.Index(
                condition=models.Q(kind="episodic"),
                fields=["source_session", "occurred_at"],
                name="memory_session_episodes",
            ),
        ),
    ]
