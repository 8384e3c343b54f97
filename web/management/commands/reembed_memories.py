"""Re-embed memories with the current embedder, e.g. after changing EMBEDDING_BACKEND or the model.

python manage.py reembed_memories            # those embedded by another model (or never)
python manage.py reembed_memories --all      # every memory
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Q
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from memory.embedding import get_embedder
from memory.models import Memory
from memory.services import memories_reembed


class Command(BaseCommand):
    help = "Recompute memory embeddings with the configured embedder (with a progress bar)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--all", action="store_true", help="re-embed every memory, not only stale ones")
        parser.add_argument("--batch-size", type=int, default=64)
        parser.add_argument("--user", type=int, default=None, help="only this user id")

    def handle(self, *args: Any, **options: Any) -> None:
        embedder = get_embedder()
        qs = Memory.objects.order_by("id")
        if not options["all"]:
            qs = qs.filter(~Q(embedding_model=embedder.name) | Q(embedding__isnull=True))
        if options["user"] is not None:
            qs = qs.filter(user_id=options["user"])
        total = qs.count()
        if total == 0:
            self.stdout.write(f"Nothing to re-embed: every memory is embedded with {embedder.name}.")
            return
        columns = (TextColumn("re-embedding"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, disable=not self.stdout.isatty()) as progress:
            task = progress.add_task("memories", total=total)
            done = memories_reembed(
                memories=qs.defer("embedding").iterator(chunk_size=1000),
                batch_size=options["batch_size"],
                on_progress=lambda n: progress.advance(task, n),
            )
        self.stdout.write(self.style.SUCCESS(f"Re-embedded {done} memories with {embedder.name}."))
