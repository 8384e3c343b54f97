"""The Django admin of every app, registered when the admin autodiscovers ``web.admin``."""

from web.admin import agents, memory, observability, sessions, users

__all__ = ["agents", "memory", "observability", "sessions", "users"]
