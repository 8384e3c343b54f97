"""The session's records in the admin, read-only: the checkpoint log (select one to resume its session from it)
and the turns (linked to their session, model calls, tool calls and memories)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from sessions.models import Checkpoint, Turn
from sessions.services import StaleSessionError, session_resume_from
from web.admin.lists import LogAdmin, known_values_filter, workflow_states
from web.admin.readonly import EvidenceAdmin, ReadOnlyAdmin
from web.admin.sessions.display import pretty_json, related_list_links


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin, LogAdmin):
    """The append-only log; rows are read-only. Select one to resume its session from it."""

    list_display = ("session", "seq", "reason", "state", "transition", "retry_count", "created_at")
    list_filter = ("reason", known_values_filter("state", "state", workflow_states), "created_at")
    search_fields = ("=session__id", "session__title", "session__user__username", "transition", "detail")
    list_select_related = ("session",)
    ordering = ("-id",)  # newest first, on the primary key
    actions = ("resume_session_here",)
    readonly_fields = (
        "session",
        "seq",
        "turn",
        "state",
        "data",
        "retry_count",
        "transition",
        "reason",
        "detail",
        "created_at",
    )

    @admin.action(description="Resume the session from this checkpoint (select exactly one)", permissions=["view"])
    def resume_session_here(self, request: HttpRequest, queryset: QuerySet[Checkpoint]) -> None:
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one checkpoint.", level=messages.ERROR)
            return
        checkpoint = queryset.select_related("session").get()
        if not request.user.has_perm("chat_sessions.change_chatsession"):
            self.message_user(request, "You may not change sessions.", level=messages.ERROR)
            return
        try:
            session_resume_from(session=checkpoint.session, checkpoint=checkpoint, actor=request.user)
        except (StaleSessionError, ValueError) as exc:
            self.message_user(request, f"Not resumed: {exc}", level=messages.ERROR)
            return
        self.message_user(request, f"Resumed {checkpoint.session} from checkpoint #{checkpoint.seq}.")


@admin.register(Turn)
class TurnAdmin(EvidenceAdmin, LogAdmin):
    """Turns are records: read-only, linked to their session, model calls, tool calls and memories."""

    list_display = (
        "__str__",
        "session_link",
        "status",
        "state_before",
        "state_after",
        "steps",
        "prompt_tokens",
        "is_demo",
        "created_at",
    )
    list_filter = ("status", "step_limit_hit", "is_demo", "created_at")
    search_fields = ("user_message", "assistant_message", "=session__id", "session__user__username")
    search_help_text = "Words in the messages (reads every turn: filter first on a big log), or a session id."
    list_select_related = ("session",)
    ordering = ("-id",)  # newest first, on the primary key
    readonly_fields = (
        "session_link",
        "seq",
        "user_message",
        "assistant_message",
        "status",
        "error",
        "state_before",
        "state_after",
        "steps",
        "step_limit_hit",
        "is_demo",
        "prompt_tokens",
        "composition_pretty",
        "retrieval_pretty",
        "related_links",
        "idempotency_key",
        "started_at",
        "created_at",
        "completed_at",
    )
    fields = readonly_fields

    @admin.display(description="session")
    def session_link(self, obj: Turn) -> str:
        url = reverse("admin:chat_sessions_chatsession_change", args=[obj.session_id])
        return format_html('<a href="{}">{}</a>', url, obj.session)

    @admin.display(description="context composition")
    def composition_pretty(self, obj: Turn) -> str:
        return pretty_json(obj.composition)

    @admin.display(description="memory retrieval")
    def retrieval_pretty(self, obj: Turn) -> str:
        return pretty_json(obj.retrieval, limit=20000)

    @admin.display(description="related")
    def related_links(self, obj: Turn) -> str:
        return related_list_links(
            obj.pk,
            (
                ("model calls", "admin:agents_llmcall_changelist", "turn__id__exact"),
                ("tool calls", "admin:agents_toolinvocation_changelist", "turn__id__exact"),
                ("memories written from it", "admin:memory_memory_changelist", "source_turn__id__exact"),
                ("checkpoints", "admin:chat_sessions_checkpoint_changelist", "turn__id__exact"),
            ),
        )
