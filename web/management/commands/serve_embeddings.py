"""``manage.py serve_embeddings``: the embedding model, once per machine, for the app's other processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from memory.embedding import HashingEmbedder
from memory.embedding_service import serve


class Command(BaseCommand):
    help = "Serve the embedding model on a Unix socket (make run starts it; see memory/embedding_service.py)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--socket", type=Path, default=settings.DATA_DIR / "embedder.sock")
        parser.add_argument(
            "--hashing",
            action="store_true",
            help="Serve the deterministic hashing embedder instead of the model (the fault tests: a real service "
            "process to stop and kill, without loading torch).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        embedder = HashingEmbedder(int(settings.EMBEDDING_DIMENSIONS)) if options["hashing"] else None
        serve(options["socket"], embedder)
