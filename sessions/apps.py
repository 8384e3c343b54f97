from __future__ import annotations

from django.apps import AppConfig


class ChatSessionsConfig(AppConfig):
    # Note: the label cannot be "sessions": django.contrib.sessions owns it.
    name = "sessions"
    label = "chat_sessions"
    verbose_name = "Chat sessions"
    default_auto_field = "django.db.models.BigAutoField"
