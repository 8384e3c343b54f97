"""The Celery tasks of every app, registered when Celery autodiscovers ``web.tasks``.

Each task's name is its module path (``web.tasks.agents.run_turn``), listed in ``core.task_names`` with the
name it had before, under which it is registered too for one release (``web.tasks.registry``).
"""

from web.tasks import agents, core, memory, observability, sessions

__all__ = ["agents", "core", "memory", "observability", "sessions"]
