"""Refusals: errors the doors turn into an answer for people (a code, a message, an HTTP status).

Every layer may raise one; the doors classify them by this base class (``core.api_errors``), never by
which module raised them or by the class's name.
"""

from __future__ import annotations


class Refusal(Exception):
    """A request the app refuses. ``code`` is stable (clients branch on it), ``status`` the HTTP status.

    ``public_message``, when a subclass sets it, is what people see instead of the exception's own text
    (which may name internals: a module path, a workflow's name)."""

    code: str = "refused"
    status: int = 400
    public_message: str = ""
    # What people see when the exception was raised without a message.
    default_message: str = "The request was refused."

    def message_for_people(self) -> str:
        return self.public_message or str(self) or self.default_message
