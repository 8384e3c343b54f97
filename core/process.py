"""When this process started: a worker heartbeat older than that comes from before a restart, and proves
nothing about the worker now (``web.health``)."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

# Set when Django imports the core app (``CoreConfig.ready`` imports this module at start-up).
STARTED_AT: datetime = timezone.now()
