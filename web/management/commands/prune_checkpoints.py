"""``manage.py prune_checkpoints [--keep-last N] [--dry-run]``: apply the checkpoint retention policy."""

from __future__ import annotations

from typing import IO, Any, cast

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sessions.services import checkpoints_prune


class Command(BaseCommand):
    help = (
        "Delete old checkpoints: per session keep the newest N and every state change "
        "(transition, reset, resume, failed, handoff)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--keep-last",
            type=int,
            default=None,
            help=f"checkpoints kept per session (default: CHECKPOINT_KEEP_LAST = {settings.CHECKPOINT_KEEP_LAST})",
        )
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        keep_last = options["keep_last"]
        if keep_last is not None and keep_last < 1:
            raise CommandError("--keep-last must be at least 1")
        dry_run = bool(options["dry_run"])
        console = Console(file=cast(IO[str], self.stdout), force_terminal=False)
        with Progress(
            TextColumn("[bold]sessions"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[deleted]} checkpoints"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("prune", total=None, deleted=0)

            def advance(done: int, total: int, deleted: int) -> None:
                progress.update(task, completed=done, total=total, deleted=deleted)

            count = checkpoints_prune(keep_last=keep_last, dry_run=dry_run, on_progress=advance)
        verb = "would delete" if dry_run else "deleted"
        self.stdout.write(f"{verb} {count} checkpoint(s)")
