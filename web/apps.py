from __future__ import annotations

from django.apps import AppConfig


class WebConfig(AppConfig):
    """The doors: admin pages, the API, the chat and ops pages, MCP, Celery tasks and management commands.

    Django's admin autodiscovery imports ``web.admin`` and Celery's ``autodiscover_tasks`` imports ``web.tasks``;
    each package imports its modules, one per app, so every door registers itself here.
    """

    name = "web"
    verbose_name = "Doors"
    default_auto_field = "django.db.models.BigAutoField"
