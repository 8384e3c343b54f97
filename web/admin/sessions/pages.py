"""A session's own pages in the admin: resume it from a checkpoint, reply to its user as staff, and the live
chat (the conversation as the user sees it, kept current, with the handoff controls). Each view takes the
sessions' ``ModelAdmin`` (``ChatSessionAdmin.get_urls`` routes them: ``session_page_urls``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from agents.workflows import state_label
from orchestrator.runtime import MessageRejected, handoff_reply, handoff_request, handoff_resume
from sessions.models import ChatSession, Checkpoint
from sessions.services import StaleSessionError, session_resume_from

# The live chat shows this many of the latest turns.
LIVE_TURNS = 30


def session_page_urls(model_admin: admin.ModelAdmin[ChatSession]) -> list[URLPattern]:
    """The URLs of a session's pages (``admin:chat_sessions_chatsession_<name>``), each behind the admin's login."""
    pages = (
        ("resume/<int:checkpoint_id>/", resume_view, "resume"),
        ("handoff-reply/", handoff_reply_view, "handoff_reply"),
        ("live/", live_view, "live"),
        ("live/transcript/", live_transcript_view, "live_transcript"),
        ("live/hand/", live_hand_view, "live_hand"),
    )
    return [
        path(
            f"<uuid:session_id>/{route}",
            model_admin.admin_site.admin_view(partial(view, model_admin)),
            name=f"chat_sessions_chatsession_{name}",
        )
        for route, view, name in pages
    ]


def resume_view(
    model_admin: admin.ModelAdmin[ChatSession], request: HttpRequest, session_id: Any, checkpoint_id: int
) -> HttpResponse:
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    session = get_object_or_404(ChatSession, pk=session_id)
    if not model_admin.has_change_permission(request, session):
        return HttpResponse(status=403)
    checkpoint = get_object_or_404(Checkpoint, pk=checkpoint_id, session=session)
    try:
        session_resume_from(session=session, checkpoint=checkpoint, actor=request.user)
    except (StaleSessionError, ValueError) as exc:
        model_admin.message_user(request, f"Not resumed: {exc}", level=messages.ERROR)
    else:
        model_admin.message_user(request, f"Resumed from checkpoint #{checkpoint.seq} ({checkpoint.state}).")
    return HttpResponseRedirect(reverse("admin:chat_sessions_chatsession_change", args=[session.pk]))


def handoff_reply_view(
    model_admin: admin.ModelAdmin[ChatSession], request: HttpRequest, session_id: Any
) -> HttpResponse:
    session = get_object_or_404(ChatSession, pk=session_id)
    if not model_admin.has_change_permission(request, session):
        return HttpResponse(status=403)
    if request.method != "POST":
        context = {
            **model_admin.admin_site.each_context(request),
            "title": f"Reply as staff: {session}",
            "session": session,
            "turns": session.turns.order_by("-seq")[:10][::-1],
            "opts": model_admin.model._meta,
        }
        return TemplateResponse(request, "admin/chat_sessions/handoff_reply.html", context)
    try:
        handoff_reply(session=session, text=request.POST.get("staff_reply", ""), author=request.user)
    except MessageRejected as exc:
        model_admin.message_user(request, f"Not sent: {exc.message}", level=messages.ERROR)
    else:
        model_admin.message_user(request, "Reply sent; it shows in the user's chat.")
    back = "admin:chat_sessions_chatsession_live" if request.POST.get("back") == "live" else None
    return HttpResponseRedirect(reverse(back or "admin:chat_sessions_chatsession_change", args=[session.pk]))


def live_context(
    model_admin: admin.ModelAdmin[ChatSession], request: HttpRequest, session: ChatSession
) -> dict[str, Any]:
    turns = list(session.turns.order_by("-seq")[:LIVE_TURNS])[::-1]
    return {
        "session": session,
        "turns": turns,
        "may_change": model_admin.has_change_permission(request, session),
        "with_person": session.status == ChatSession.Status.NEEDS_HUMAN,
        "state_label": state_label(session.workflow, session.workflow_version, session.state),
    }


def live_view(model_admin: admin.ModelAdmin[ChatSession], request: HttpRequest, session_id: Any) -> HttpResponse:
    """The session's conversation as the user sees it (the agent's replies, staff replies signed), re-read
    every few seconds, with *Hand to a person*, a reply box while a person has it, and *Hand back*."""
    session = get_object_or_404(ChatSession.objects.select_related("user", "agent"), pk=session_id)
    if not model_admin.has_view_permission(request, session):
        return HttpResponse(status=403)
    context = {
        **model_admin.admin_site.each_context(request),
        **live_context(model_admin, request, session),
        "title": f"Live chat: {session.title or 'Untitled chat'}",
        "opts": model_admin.model._meta,
        "original": session,
    }
    return TemplateResponse(request, "admin/chat_sessions/live.html", context)


def live_transcript_view(
    model_admin: admin.ModelAdmin[ChatSession], request: HttpRequest, session_id: Any
) -> HttpResponse:
    session = get_object_or_404(ChatSession.objects.select_related("user", "agent"), pk=session_id)
    if not model_admin.has_view_permission(request, session):
        return HttpResponse(status=403)
    response = TemplateResponse(
        request, "admin/chat_sessions/live_transcript.html", live_context(model_admin, request, session)
    )
    response["Cache-Control"] = "no-store"
    return response


def live_hand_view(model_admin: admin.ModelAdmin[ChatSession], request: HttpRequest, session_id: Any) -> HttpResponse:
    """POST ``to=person`` (hand the session to a person) or ``to=agent`` (give it back)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    session = get_object_or_404(ChatSession, pk=session_id)
    if not model_admin.has_change_permission(request, session):
        return HttpResponse(status=403)
    to = request.POST.get("to")
    if to not in ("person", "agent"):
        return HttpResponse("Say to=person or to=agent.", status=400, content_type="text/plain")
    # The page may be older than the session (another tab, another person): act on the status it has now.
    if session.status == ChatSession.Status.CLOSED:
        model_admin.message_user(request, "This chat is closed: nothing was changed.", level=messages.WARNING)
    elif to == "person":
        if handoff_request(session=session, actor=request.user, reason=request.POST.get("reason", "")[:300]):
            model_admin.message_user(request, "Handed to a person: the agent stops answering; reply below.")
        else:
            model_admin.message_user(request, "A person has this chat already.", level=messages.WARNING)
    elif session.status != ChatSession.Status.NEEDS_HUMAN:
        model_admin.message_user(
            request, "The agent has this chat already: nothing was changed.", level=messages.WARNING
        )
    else:
        handoff_resume(session=session, actor=request.user)
        model_admin.message_user(request, "Handed back: the agent answers the next message.")
    return HttpResponseRedirect(reverse("admin:chat_sessions_chatsession_live", args=[session.pk]))
