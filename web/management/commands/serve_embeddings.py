"""``manage.py serve_embeddings``: the embedding model, once per machine, for the app's other processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from memory.embedding_service import serve


class Command(BaseCommand):
    help = "Serve the embedding model on a Unix socket (make run starts it; see memory/embedding_service.py)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--socket", type=Path, default=settings.DATA_DIR / "embedder.sock")

    def handle(self, *args: Any, **options: Any) -> None:
        serve(options["socket"])
