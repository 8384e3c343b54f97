from __future__ import annotations

from typing import Any

from django.db import migrations, models


def mark_written(apps: Any, schema_editor: Any) -> None:
    """Turns whose memory write ran before this field existed: the proof was an episode or the write's
    fact-extraction call. Marked, so the requeue sweep never writes them again."""
    from django.db.models import Exists, OuterRef, Q
    from django.db.models.functions import Coalesce, Now

    Turn = apps.get_model("chat_sessions", "Turn")
    Memory = apps.get_model("memory", "Memory")
    LLMCall = apps.get_model("agents", "LLMCall")
    episode = Memory.objects.filter(source_turn=OuterRef("pk"), kind="episodic")
    extraction = LLMCall.objects.filter(turn=OuterRef("pk"), purpose="extract")
    Turn.objects.filter(memories_written_at__isnull=True).filter(Q(Exists(episode)) | Q(Exists(extraction))).update(
        memories_written_at=Coalesce("completed_at", Now())
    )


class Migration(migrations.Migration):
    dependencies = [
        ("chat_sessions", "0001_initial"),
        ("memory", "0005_pinned_ranked_index"),
        ("agents", "0002_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="turn",
            name="memories_written_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(mark_written, migrations.RunPython.noop),
    ]
