"""The sessions' admin (``ChatSessionAdmin``): the list, a session's page (its state and collected data, links
to its turns, checkpoints, memories and calls), deleting only sessions with no running turn, and the actions:
reset, resume from the last good state, hand to a person and back. A session's own pages: ``pages``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import redirect
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from orchestrator.runtime import handoff_request, handoff_resume
from sessions.locks import SessionBusyError, session_is_locked
from sessions.models import ChatSession
from sessions.services import StaleSessionError, session_delete, session_reset, session_resume_last_good
from web.admin.sessions.display import branch_summary, pretty_json, related_list_links
from web.admin.sessions.inlines import CheckpointInline, TurnInline
from web.admin.sessions.pages import session_page_urls


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "user",
        "agent",
        "workflow",
        "state",
        "status",
        "retry_count",
        "version",
        "updated_at",
    )
    list_filter = ("status", "workflow", "state", "agent")
    search_fields = ("title", "user__username", "user__email", "state", "id")
    list_select_related = ("user", "agent")
    date_hierarchy = "updated_at"
    actions = ("reset_sessions", "resume_last_good", "hand_to_a_person", "hand_back_to_agent")
    inlines = (CheckpointInline, TurnInline)
    fields = (
        "id",
        "title",
        "user",
        "agent",
        "workflow",
        "state",
        "status",
        "data_pretty",
        "retry_count",
        "last_transition",
        "last_good_state",
        "version",
        "summary",
        "summary_through_seq",
        "branches",
        "llm_calls_link",
        "related_links",
        "handoff_reply_form",
        "created_at",
        "updated_at",
    )
    readonly_fields = tuple(f for f in fields if f != "title")

    @admin.display(description="collected data")
    def data_pretty(self, obj: ChatSession) -> str:
        return pretty_json(obj.data)

    @admin.display(description="branches")
    def branches(self, obj: ChatSession) -> str:
        return branch_summary(obj)

    @admin.display(description="model calls")
    def llm_calls_link(self, obj: ChatSession) -> str:
        try:
            url = reverse("admin:agents_llmcall_changelist")
        except NoReverseMatch:
            return "—"
        return format_html('<a href="{}?session__id__exact={}">model calls of this session</a>', url, obj.pk)

    @admin.display(description="related")
    def related_links(self, obj: ChatSession) -> str:
        return related_list_links(
            obj.pk,
            (
                ("turns", "admin:chat_sessions_turn_changelist", "session__id__exact"),
                ("checkpoints", "admin:chat_sessions_checkpoint_changelist", "session__id__exact"),
                ("memories from this session", "admin:memory_memory_changelist", "source_session__id__exact"),
                ("tool calls", "admin:agents_toolinvocation_changelist", "session__id__exact"),
                ("bookings", "admin:booking_example_booking_changelist", "session__id__exact"),
            ),
        )

    @admin.display(description="reply as staff")
    def handoff_reply_form(self, obj: ChatSession) -> str:
        live = reverse("admin:chat_sessions_chatsession_live", args=[obj.pk])
        if obj.status != ChatSession.Status.NEEDS_HUMAN:
            return format_html(
                '<a class="button" href="{}">Live chat</a> (replies only for sessions handed to a person)', live
            )
        url = reverse("admin:chat_sessions_chatsession_handoff_reply", args=[obj.pk])
        return format_html(
            '<a class="button" href="{}">Live chat</a> <a class="button" href="{}">Reply to the user as staff</a>',
            live,
            url,
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Sessions start in the chat or the API (``session_create`` puts them in their workflow's first state).
        return False

    def get_urls(self) -> list[Any]:
        return [*session_page_urls(self), *super().get_urls()]

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        """A session whose turn is running is not offered for deletion (the confirmation page says why)."""
        if request.method == "POST" and session_is_locked(object_id):
            self.message_user(request, "Not deleted: a turn is running on this session.", level=messages.ERROR)
            return redirect("admin:chat_sessions_chatsession_change", object_id)
        return super().delete_view(request, object_id, extra_context)

    def delete_model(self, request: HttpRequest, obj: ChatSession) -> None:
        """Through the service, which holds the session's lock to the commit (a turn may start meanwhile)."""
        self._delete_idle(request, [obj])

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions: dict[str, Any] = dict(super().get_actions(request))
        if "delete_selected" in actions:  # Django's own deletes under a running turn
            actions["delete_selected"] = (
                type(self).delete_idle_sessions,
                "delete_selected",
                "Delete selected sessions (not those with a running turn)",
            )
        return actions

    @admin.action(permissions=["delete"])
    def delete_idle_sessions(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> None:
        deleted = self._delete_idle(request, queryset)
        if deleted:
            self.message_user(request, f"Deleted {deleted} session(s).")

    def _delete_idle(self, request: HttpRequest, sessions: Iterable[ChatSession]) -> int:
        """Delete each session through ``session_delete``; say which were not, a turn running on them."""
        deleted, busy = 0, []
        for session in sessions:
            try:
                session_delete(session=session)
                deleted += 1
            except SessionBusyError:
                busy.append(str(session))
        if busy:
            self.message_user(
                request, f"Not deleted, a turn is running on them: {', '.join(busy)}.", level=messages.ERROR
            )
        return deleted

    @admin.action(description="Hand to a person (the agent stops answering)", permissions=["change"])
    def hand_to_a_person(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> None:
        handed = sum(handoff_request(session=session, actor=request.user) for session in queryset)
        self.message_user(
            request, f"Handed {handed} session(s) to a person; reply to them from each session's page here."
        )

    @admin.action(description="Hand back to the agent (sessions waiting for a human)", permissions=["change"])
    def hand_back_to_agent(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> None:
        sessions = list(queryset.filter(status=ChatSession.Status.NEEDS_HUMAN))
        for session in sessions:
            handoff_resume(session=session, actor=request.user)
        self.message_user(request, f"Handed {len(sessions)} session(s) back to the agent.")

    @admin.action(description="Reset: start over (initial state, no data)", permissions=["change"])
    def reset_sessions(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> None:
        self._change_each(request, queryset, session_reset, done="Reset {} session(s).")

    @admin.action(description="Resume from the last good state", permissions=["change"])
    def resume_last_good(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> None:
        self._change_each(request, queryset, session_resume_last_good, done="Resumed {} session(s).")

    def _change_each(
        self,
        request: HttpRequest,
        sessions: Iterable[ChatSession],
        change: Callable[..., object],
        *,
        done: str,
    ) -> None:
        """``change(session=…, actor=…)`` on each session; say how many were changed (``done``, formatted with the
        count) and how many were not, changed meanwhile (``StaleSessionError``)."""
        changed, stale = 0, 0
        for session in sessions:
            try:
                change(session=session, actor=request.user)
                changed += 1
            except StaleSessionError:
                stale += 1
        self.message_user(request, done.format(changed))
        if stale:
            self.message_user(request, f"{stale} changed meanwhile; try again.", level=messages.WARNING)
