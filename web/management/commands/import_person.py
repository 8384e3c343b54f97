"""``manage.py import_person --user NAME FILE [--format mem0]``: bring an export in (``people.portability``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from people.portability import ImportRejected, mem0_records, parse_export, person_import


class Command(BaseCommand):
    help = "Import a person's export (ours, or Mem0's with --format mem0). Idempotent; a bad line writes nothing."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument("--user", required=True)
        parser.add_argument("--format", choices=["agents", "mem0"], default="agents")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"No user is called {options['user']!r}.")
        path: Path = options["file"]
        if not path.exists():
            raise CommandError(f"No file {path}.")
        columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
        with Progress(*columns, transient=True) as progress:
            task = progress.add_task("checking every line", total=None)
            text = path.read_text(encoding="utf-8")
            try:
                parsed = mem0_records(text) if options["format"] == "mem0" else parse_export(text.splitlines())
            except ImportRejected as exc:
                raise CommandError(f"{path}: {exc}; nothing was imported.") from exc
            progress.update(task, description="writing (and embedding the memories)")
            report = person_import(user=user, parsed=parsed)
        self.stdout.write(json.dumps(report.as_dict(), indent=1))
        created = ", ".join(f"{n} {name}" for name, n in report.created.items())
        self.stdout.write(self.style.SUCCESS(f"Imported {created}; skipped {len(report.skipped)} line(s)."))
