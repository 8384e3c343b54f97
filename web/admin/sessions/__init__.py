"""Admin for sessions: the state, the turns and the checkpoint timeline, with reset and resume actions.

State is never edited by hand here: every change goes through ``sessions.services`` (version-checked
and checkpointed). Nothing on these pages shows endpoint settings or keys; an agent appears by name.

- ``chat_sessions``: the sessions' admin (``ChatSessionAdmin``): its list, its page and its actions;
- ``pages``: a session's own pages: resume from a checkpoint, reply as staff, the live chat;
- ``inlines``: the latest turns and checkpoints on a session's page;
- ``logs``: the checkpoint log and the turns, read-only;
- ``display``: what these pages show alike (JSON, links to related lists).
"""

from web.admin.sessions import chat_sessions, logs
from web.admin.sessions.inlines import INLINE_LATEST_ROWS

__all__ = ["INLINE_LATEST_ROWS", "chat_sessions", "logs"]
