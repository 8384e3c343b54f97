"""The latest turns and checkpoints of a session, on its page (the checkpoints each with a button to resume
the session from it)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from sessions.models import Checkpoint, Turn
from web.admin.sessions.display import compact_json

# A session's page shows its latest turns and checkpoints, not all of them: a chat of a thousand turns made
# it 6.5 MB and 2.5 s, with two thousand resume buttons. The rest are in the turn and checkpoint lists,
# filtered on the session (the "related" links).
INLINE_LATEST_ROWS = 50


class LatestRowsFormSet(BaseInlineFormSet):
    """The session's latest ``INLINE_LATEST_ROWS`` rows by ``seq``, oldest first. (The rows are read-only: a
    form posted back after a new turn moved the window saves as well, its rows unchanged.)"""

    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_latest_rows"):
            rows = super().get_queryset()
            latest = rows.order_by("-seq").values_list("pk", flat=True)[:INLINE_LATEST_ROWS]
            self._latest_rows = rows.filter(pk__in=list(latest)).order_by("seq")
        return self._latest_rows


class TurnInline(admin.TabularInline):
    model = Turn
    formset = LatestRowsFormSet
    verbose_name_plural = f"Turns (the latest {INLINE_LATEST_ROWS}; every turn: the related links above)"
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ("seq",)
    fields = (
        "seq",
        "status",
        "short_user_message",
        "short_reply",
        "state_before",
        "state_after",
        "is_demo",
        "created_at",
    )
    readonly_fields = fields

    @admin.display(description="user message")
    def short_user_message(self, obj: Turn) -> str:
        return obj.user_message[:120]

    @admin.display(description="reply")
    def short_reply(self, obj: Turn) -> str:
        return obj.assistant_message[:120]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class CheckpointInline(admin.TabularInline):
    """The timeline: every checkpoint in order, each with a button to resume the session from it."""

    model = Checkpoint
    formset = LatestRowsFormSet
    extra = 0
    can_delete = False
    ordering = ("seq",)
    fields = ("seq", "created_at", "reason", "state", "transition", "retry_count", "data_json", "detail", "resume")
    readonly_fields = fields
    verbose_name_plural = (
        f"Checkpoint timeline (the latest {INLINE_LATEST_ROWS}; every checkpoint: the related links above)"
    )

    @admin.display(description="data")
    def data_json(self, obj: Checkpoint) -> str:
        return compact_json(obj.data)

    @admin.display(description="")
    def resume(self, obj: Checkpoint) -> str:
        if obj.pk is None:
            return ""
        url = reverse("admin:chat_sessions_chatsession_resume", args=[obj.session_id, obj.pk])
        # Note: formaction posts the surrounding change form (with its CSRF token) to the resume view.
        return format_html(
            '<button type="submit" class="button" formaction="{}" formmethod="post" name="resume">'
            "Resume from #{}</button>",
            url,
            obj.seq,
        )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
