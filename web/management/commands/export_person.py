"""``manage.py export_person --user NAME [--output FILE]``: one person's data as JSON Lines (``people.portability``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from people.portability import person_export


class Command(BaseCommand):
    help = "Export a person's sessions, turns and memories as JSON Lines (to a file, or to standard output)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True)
        parser.add_argument("--output", type=Path, help="File to write (default: standard output).")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"No user is called {options['user']!r}.")
        output: Path | None = options["output"]
        if output is None:
            for line in person_export(user=user):
                sys.stdout.write(line)
            return
        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TextColumn("{task.completed} lines"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, transient=False) as progress, output.open("w", encoding="utf-8") as out:
            task = progress.add_task(f"exporting {user.get_username()}", total=None)
            for line in person_export(user=user):
                out.write(line)
                progress.advance(task)
        self.stdout.write(self.style.SUCCESS(f"Wrote {output}."))
