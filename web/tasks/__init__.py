"""The Celery tasks of every app, registered when Celery autodiscovers ``web.tasks``.

Task names are kept from before the doors moved here (``agents.tasks.run_turn``, ...), so a message queued by
an older deployment is still run by a newer worker.
"""

from web.tasks import agents, core, memory, observability, sessions

__all__ = ["agents", "core", "memory", "observability", "sessions"]
