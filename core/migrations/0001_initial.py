from __future__ import annotations

from django.db import migrations, models
from pgvector.django import VectorExtension


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        # pgvector: every embedding column and HNSW index depends on it.
        VectorExtension(),
        migrations.CreateModel(
            name="WorkerHeartbeat",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("hostname", models.CharField(max_length=255, unique=True)),
                ("seen_at", models.DateTimeField()),
            ],
        ),
    ]
