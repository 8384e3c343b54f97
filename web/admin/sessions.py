"""Admin for sessions: the state, the turns and the checkpoint timeline, with reset and resume actions.

State is never edited by hand here: every change goes through ``sessions.services`` (version-checked
and checkpointed). Nothing on these pages shows endpoint settings or keys; an agent appears by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html

from agents.workflows import state_label
from orchestrator.runtime import MessageRejected, handoff_reply, handoff_request, handoff_resume
from sessions.locks import SessionBusyError, session_is_locked
from sessions.models import ChatSession, Checkpoint, Turn
from sessions.services import (
    StaleSessionError,
    session_delete,
    session_reset,
    session_resume_from,
    session_resume_last_good,
)
from web.admin.lists import LogAdmin, known_values_filter, workflow_states


def _compact_json(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _related_links(pk: Any, specs: tuple[tuple[str, str, str], ...]) -> str:
    """Links to admin change lists filtered on this object: (label, url name, filter field)."""
    links = []
    for label, name, query in specs:
        try:
            links.append(format_html('<a href="{}?{}={}">{}</a>', reverse(name), query, pk, label))
        except NoReverseMatch:
            continue
    return format_html(" · ".join(["{}"] * len(links)), *links) if links else "—"


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
        return _compact_json(obj.data)

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
        "llm_calls_link",
        "related_links",
        "handoff_reply_form",
        "created_at",
        "updated_at",
    )
    readonly_fields = tuple(f for f in fields if f != "title")

    @admin.display(description="collected data")
    def data_pretty(self, obj: ChatSession) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.data, indent=2, sort_keys=True, default=str))

    @admin.display(description="model calls")
    def llm_calls_link(self, obj: ChatSession) -> str:
        try:
            url = reverse("admin:agents_llmcall_changelist")
        except NoReverseMatch:
            return "—"
        return format_html('<a href="{}?session__id__exact={}">model calls of this session</a>', url, obj.pk)

    @admin.display(description="related")
    def related_links(self, obj: ChatSession) -> str:
        return _related_links(
            obj.pk,
            (
                ("turns", "admin:chat_sessions_turn_changelist", "session__id__exact"),
                ("checkpoints", "admin:chat_sessions_checkpoint_changelist", "session__id__exact"),
                ("memories from this session", "admin:memory_memory_changelist", "source_session__id__exact"),
                ("tool calls", "admin:agents_toolinvocation_changelist", "session__id__exact"),
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
        custom = [
            path(
                "<uuid:session_id>/resume/<int:checkpoint_id>/",
                self.admin_site.admin_view(self.resume_view),
                name="chat_sessions_chatsession_resume",
            ),
            path(
                "<uuid:session_id>/handoff-reply/",
                self.admin_site.admin_view(self.handoff_reply_view),
                name="chat_sessions_chatsession_handoff_reply",
            ),
            path(
                "<uuid:session_id>/live/",
                self.admin_site.admin_view(self.live_view),
                name="chat_sessions_chatsession_live",
            ),
            path(
                "<uuid:session_id>/live/transcript/",
                self.admin_site.admin_view(self.live_transcript_view),
                name="chat_sessions_chatsession_live_transcript",
            ),
            path(
                "<uuid:session_id>/live/hand/",
                self.admin_site.admin_view(self.live_hand_view),
                name="chat_sessions_chatsession_live_hand",
            ),
        ]
        return custom + super().get_urls()

    def resume_view(self, request: HttpRequest, session_id: Any, checkpoint_id: int) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        session = get_object_or_404(ChatSession, pk=session_id)
        if not self.has_change_permission(request, session):
            return HttpResponse(status=403)
        checkpoint = get_object_or_404(Checkpoint, pk=checkpoint_id, session=session)
        try:
            session_resume_from(session=session, checkpoint=checkpoint, actor=request.user)
        except (StaleSessionError, ValueError) as exc:
            self.message_user(request, f"Not resumed: {exc}", level=messages.ERROR)
        else:
            self.message_user(request, f"Resumed from checkpoint #{checkpoint.seq} ({checkpoint.state}).")
        return HttpResponseRedirect(reverse("admin:chat_sessions_chatsession_change", args=[session.pk]))

    def handoff_reply_view(self, request: HttpRequest, session_id: Any) -> HttpResponse:
        session = get_object_or_404(ChatSession, pk=session_id)
        if not self.has_change_permission(request, session):
            return HttpResponse(status=403)
        if request.method != "POST":
            context = {
                **self.admin_site.each_context(request),
                "title": f"Reply as staff: {session}",
                "session": session,
                "turns": session.turns.order_by("-seq")[:10][::-1],
                "opts": self.model._meta,
            }
            return TemplateResponse(request, "admin/chat_sessions/handoff_reply.html", context)
        try:
            handoff_reply(session=session, text=request.POST.get("staff_reply", ""), author=request.user)
        except MessageRejected as exc:
            self.message_user(request, f"Not sent: {exc.message}", level=messages.ERROR)
        else:
            self.message_user(request, "Reply sent; it shows in the user's chat.")
        back = "admin:chat_sessions_chatsession_live" if request.POST.get("back") == "live" else None
        return HttpResponseRedirect(reverse(back or "admin:chat_sessions_chatsession_change", args=[session.pk]))

    # --- the live chat: the conversation as the user sees it, kept current, with the handoff controls --------
    LIVE_TURNS = 30

    def _live_context(self, request: HttpRequest, session: ChatSession) -> dict[str, Any]:
        turns = list(session.turns.order_by("-seq")[: self.LIVE_TURNS])[::-1]
        return {
            "session": session,
            "turns": turns,
            "may_change": self.has_change_permission(request, session),
            "with_person": session.status == ChatSession.Status.NEEDS_HUMAN,
            "state_label": state_label(session.workflow, session.workflow_version, session.state),
        }

    def live_view(self, request: HttpRequest, session_id: Any) -> HttpResponse:
        """The session's conversation as the user sees it (the agent's replies, staff replies signed), re-read
        every few seconds, with *Hand to a person*, a reply box while a person has it, and *Hand back*."""
        session = get_object_or_404(ChatSession.objects.select_related("user", "agent"), pk=session_id)
        if not self.has_view_permission(request, session):
            return HttpResponse(status=403)
        context = {
            **self.admin_site.each_context(request),
            **self._live_context(request, session),
            "title": f"Live chat: {session.title or 'Untitled chat'}",
            "opts": self.model._meta,
            "original": session,
        }
        return TemplateResponse(request, "admin/chat_sessions/live.html", context)

    def live_transcript_view(self, request: HttpRequest, session_id: Any) -> HttpResponse:
        session = get_object_or_404(ChatSession.objects.select_related("user", "agent"), pk=session_id)
        if not self.has_view_permission(request, session):
            return HttpResponse(status=403)
        response = TemplateResponse(
            request, "admin/chat_sessions/live_transcript.html", self._live_context(request, session)
        )
        response["Cache-Control"] = "no-store"
        return response

    def live_hand_view(self, request: HttpRequest, session_id: Any) -> HttpResponse:
        """POST ``to=person`` (hand the session to a person) or ``to=agent`` (give it back)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        session = get_object_or_404(ChatSession, pk=session_id)
        if not self.has_change_permission(request, session):
            return HttpResponse(status=403)
        to = request.POST.get("to")
        if to not in ("person", "agent"):
            return HttpResponse("Say to=person or to=agent.", status=400, content_type="text/plain")
        # The page may be older than the session (another tab, another person): act on the status it has now.
        if session.status == ChatSession.Status.CLOSED:
            self.message_user(request, "This chat is closed: nothing was changed.", level=messages.WARNING)
        elif to == "person":
            if handoff_request(session=session, actor=request.user, reason=request.POST.get("reason", "")[:300]):
                self.message_user(request, "Handed to a person: the agent stops answering; reply below.")
            else:
                self.message_user(request, "A person has this chat already.", level=messages.WARNING)
        elif session.status != ChatSession.Status.NEEDS_HUMAN:
            self.message_user(request, "The agent has this chat already: nothing was changed.", level=messages.WARNING)
        else:
            handoff_resume(session=session, actor=request.user)
            self.message_user(request, "Handed back: the agent answers the next message.")
        return HttpResponseRedirect(reverse("admin:chat_sessions_chatsession_live", args=[session.pk]))

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
        done, stale = 0, 0
        for session in queryset:
            try:
                session_reset(session=session, actor=request.user)
                done += 1
            except StaleSessionError:
                stale += 1
        self.message_user(request, f"Reset {done} session(s).")
        if stale:
            self.message_user(request, f"{stale} changed meanwhile; try again.", level=messages.WARNING)

    @admin.action(description="Resume from the last good state", permissions=["change"])
    def resume_last_good(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> None:
        done, stale = 0, 0
        for session in queryset:
            try:
                session_resume_last_good(session=session, actor=request.user)
                done += 1
            except StaleSessionError:
                stale += 1
        self.message_user(request, f"Resumed {done} session(s).")
        if stale:
            self.message_user(request, f"{stale} changed meanwhile; try again.", level=messages.WARNING)


@admin.register(Checkpoint)
class CheckpointAdmin(LogAdmin):
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

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Viewing is allowed through the view permission; the log itself is never edited.
        return False

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
class TurnAdmin(LogAdmin):
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
        return format_html("<pre>{}</pre>", json.dumps(obj.composition, indent=2, sort_keys=True, default=str))

    @admin.display(description="memory retrieval")
    def retrieval_pretty(self, obj: Turn) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.retrieval, indent=2, sort_keys=True, default=str)[:20000])

    @admin.display(description="related")
    def related_links(self, obj: Turn) -> str:
        return _related_links(
            obj.pk,
            (
                ("model calls", "admin:agents_llmcall_changelist", "turn__id__exact"),
                ("tool calls", "admin:agents_toolinvocation_changelist", "turn__id__exact"),
                ("memories written from it", "admin:memory_memory_changelist", "source_turn__id__exact"),
                ("checkpoints", "admin:chat_sessions_checkpoint_changelist", "turn__id__exact"),
            ),
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
