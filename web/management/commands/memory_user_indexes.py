"""Build (and drop) the per-user HNSW indexes of big memory histories now, instead of waiting for the
daily task.

python manage.py memory_user_indexes              # users with at least MEMORY_EXACT_SEARCH_MAX memories
python manage.py memory_user_indexes --min 50000  # another threshold
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from memory.services import user_indexes_sync


class Command(BaseCommand):
    help = "Create the per-user HNSW indexes of users with big memory histories; drop unneeded ones."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--min", type=int, default=None, help="memories a user needs for an index of their own")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["min"] is not None and options["min"] < 1:
            # 0 or less would build an HNSW index for every user, each one a full graph build.
            raise CommandError(f"--min must be at least 1 (got {options['min']})")
        columns = (TextColumn("building per-user HNSW indexes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, disable=not self.stdout.isatty()) as progress:
            task = progress.add_task("indexes", total=None)
            result = user_indexes_sync(
                minimum=options["min"],
                on_plan=lambda n: progress.update(task, total=n),
                on_index=lambda _user: progress.advance(task),
            )
        self.stdout.write(
            self.style.SUCCESS(
                f"Per-user vector indexes: {len(result.created)} created, {len(result.kept)} kept, "
                f"{len(result.dropped)} dropped."
            )
        )
