# Fewer indexes to write on every turn. Each of these is covered by a composite index that leads with
# its column: the session's user by session_user_recent, a turn's and a checkpoint's session by their
# (session, seq) constraints, a turn's status by turn_stuck_sweep (status, started_at). The session's
# status keeps a plain btree without the LIKE twin.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from core.index_ops import DropFieldIndexes


class Migration(migrations.Migration):
    # The indexes are dropped (and the kept one built, where missing) without blocking a live table.
    atomic = False

    dependencies = [
        ("chat_sessions", "0004_memory_write_pending_index"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                DropFieldIndexes(
                    [
                        ("chat_sessions_chatsession", "user_id", False),
                        ("chat_sessions_chatsession", "status", True),
                        ("chat_sessions_turn", "session_id", False),
                        ("chat_sessions_turn", "status", True),
                        ("chat_sessions_checkpoint", "session_id", False),
                    ],
                    keep={("chat_sessions_chatsession", "status"): "session_status"},
                ),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="chatsession",
                    name="status",
                    field=models.CharField(
                        choices=[
                            ("active", "Active"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                            ("needs_human", "Needs a human"),
                            ("closed", "Closed"),
                        ],
                        default="active",
                        max_length=20,
                    ),
                ),
                migrations.AlterField(
                    model_name="chatsession",
                    name="user",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="chat_sessions",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                migrations.AlterField(
                    model_name="checkpoint",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="checkpoints",
                        to="chat_sessions.chatsession",
                    ),
                ),
                migrations.AlterField(
                    model_name="turn",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="turns",
                        to="chat_sessions.chatsession",
                    ),
                ),
                migrations.AlterField(
                    model_name="turn",
                    name="status",
                    field=models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("running", "Running"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                        ],
                        default="pending",
                        max_length=12,
                    ),
                ),
                migrations.AddIndex(
                    model_name="chatsession", index=models.Index(fields=["status"], name="session_status")
                ),
            ],
        ),
    ]
