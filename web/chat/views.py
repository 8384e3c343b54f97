"""The web chat: sign-in lives in web.urls; here are the session list, a new chat, the chat page,
its streaming endpoint (server-sent events) and the panels (workflow, memory, context inspector).

Another user's session is a 404, never a 403. Model output and memories reach the page only as
sanitized HTML (``web.chat.rendering``) or as text set with ``textContent`` in the browser.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from uuid import UUID

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Exists, OuterRef, Prefetch
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from agents.models import Agent, ToolInvocation
from agents.selectors import active_agents, agent_model_label
from agents.workflows import get_workflow, state_label
from core.api_errors import error_body, error_response, refusal_headers, runtime_error_status
from core.text import state_words
from core.throttles import messages_rate_wait
from orchestrator.begin import session_unavailable
from sessions.locks import SessionBusyError
from sessions.models import ChatSession, Turn
from sessions.selectors import own_sessions
from sessions.services import session_create, session_delete
from web.chat.branches import versions_of_turns
from web.chat.signed_in import signed_in_or_401
from web.chat.streaming import idempotency_key_from, is_asgi, turn_event_response
from web.selectors import memory_panel_lists


def _own_session(request: HttpRequest, session_id: UUID) -> ChatSession:
    return get_object_or_404(own_sessions(request.user), pk=session_id)


def _model_label(agent: Agent) -> dict[str, Any]:
    return agent_model_label(agent)


def _workflow_panel(session: ChatSession) -> dict[str, Any]:
    """The workflow's states in order, which one is current, and the data collected so far."""
    states: list[str] = []
    title = session.workflow
    terminal: set[str] = set()
    slots: tuple[str, ...] = ()
    label: Callable[[str], str] = state_words
    try:
        workflow = get_workflow(session.workflow, session.workflow_version)
        states = list(workflow.states)
        slots = workflow.slot_names
        title = str(getattr(workflow, "title", "") or session.workflow)
        terminal = set(workflow.terminal_states)
        label = workflow.state_label
    except (ImportError, LookupError, KeyError, ValueError):
        pass
    current = states.index(session.state) if session.state in states else -1
    steps = [
        {
            "name": name,
            "label": label(name),
            "current": i == current,
            "done": current >= 0 and i < current,
            "terminal": name in terminal,
        }
        for i, name in enumerate(states)
    ]
    # In the workflow's order of its slots (origin before destination), then what its actions added: the stored
    # order is jsonb's (shortest key first), which put "origin" after "passengers".
    known = {key: value for key, value in (session.data or {}).items() if value not in (None, "", [])}
    place = {slot: i for i, slot in enumerate(slots)}
    data = sorted(known.items(), key=lambda item: place.get(item[0], len(place)))
    return {
        "title": title,
        "steps": steps,
        "state": session.state,
        "state_label": label(session.state),
        "data": data,
        "status": session.status,
    }


def _inspector(turn: Turn | None) -> dict[str, Any] | None:
    """Prompt sections as shares of the prompt limit, for the staff context inspector."""
    if turn is None or not turn.composition:
        return None
    composition = turn.composition
    sections: dict[str, int] = {k: int(v) for k, v in (composition.get("sections") or {}).items()}
    limit = int(composition.get("limit") or 0) or max(1, sum(sections.values()))
    bars: list[dict[str, Any]] = [
        {"name": name, "tokens": tokens, "percent": round(100.0 * tokens / limit, 2)}
        for name, tokens in sections.items()
        if tokens > 0
    ]
    turns = composition.get("turns") or {}
    memories = composition.get("memories") or {}
    return {
        "turn": turn,
        "bars": bars,
        "total": int(composition.get("total") or sum(sections.values())),
        "limit": limit,
        "window": composition.get("window"),
        "free_percent": max(0.0, round(100.0 - sum(float(b["percent"]) for b in bars), 2)),
        "degradations": composition.get("degradations") or [],
        "turns_included": turns.get("included") or [],
        "turns_dropped": turns.get("dropped") or [],
        "memories_included": memories.get("included") or [],
        "memories_dropped": memories.get("dropped") or [],
        "raw": json.dumps(composition, indent=2, default=str),
    }


def _panels_context(request: HttpRequest, session: ChatSession) -> dict[str, Any]:
    finished = session.turns.exclude(status=Turn.Status.RUNNING).order_by("-seq")
    last = finished.first()
    # The agent's latest turn that searched memory and built a prompt: turns a person answered (a handed-off
    # chat) have neither, and left the panel saying "No turn yet." and the inspector gone (issue 36).
    searched = last if last is None or last.retrieval else finished.exclude(retrieval={}).first()
    composed = last if last is None or last.composition else finished.exclude(composition={}).first()
    retrieval = (searched.retrieval if searched is not None else None) or {}
    return {
        "session": session,
        "workflow": _workflow_panel(session),
        "last_turn": last,
        "retrieval_turn": searched,
        "retrieval": retrieval,
        **memory_panel_lists(retrieval.get("candidates") or []),
        "inspector": _inspector(composed) if request.user.is_staff else None,
    }


# Chats listed a page on the home page (the newest first).
HOME_PAGE_SESSIONS = 50


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """My sessions, newest first, ``HOME_PAGE_SESSIONS`` a page (``?page=``; a page past the last shows the
    last), and a form to start a new chat with an agent."""
    owner: Any = request.user  # signed in (login_required)
    # A chat nothing was sent in is not listed (starting one and leaving left "Untitled chat"s piling up).
    # A branched chat is listed once, as the branch it is on (its page moves between the others); a branch nothing
    # was sent on yet (a fork whose message was refused) does not hide the others.
    later_branch = ChatSession.objects.filter(
        chat_root=OuterRef("chat_root"), updated_at__gt=OuterRef("updated_at")
    ).filter(Exists(Turn.objects.filter(session=OuterRef("pk"))))
    sessions = (
        ChatSession.objects.filter(user=owner)
        .filter(Exists(Turn.objects.filter(session=OuterRef("pk"))))
        .exclude(Exists(later_branch))
        .select_related("agent")
        .order_by("-updated_at", "pk")
    )
    page = Paginator(sessions, HOME_PAGE_SESSIONS).get_page(request.GET.get("page"))
    agents = list(active_agents())
    # Which agents the demo model answers (no LLM configured): said on the page, as on every chat page.
    demo: dict[int, bool] = {}
    for agent in [*agents, *(s.agent for s in page.object_list)]:
        if agent.pk not in demo:
            demo[agent.pk] = bool(_model_label(agent)["is_demo"])
    labels: dict[tuple[str, int | None, str], str] = {}
    for s in page.object_list:
        key = (s.workflow, s.workflow_version, s.state)
        if key not in labels:
            labels[key] = state_label(*key)
    chats = [(s, demo[s.agent_id], labels[(s.workflow, s.workflow_version, s.state)]) for s in page.object_list]
    demo_agents = {agent.pk for agent in agents if demo[agent.pk]}
    return render(request, "home.html", {"chats": chats, "page": page, "agents": agents, "demo_agents": demo_agents})


class NewChatForm(forms.Form):
    """An active agent (an unknown or malformed id is "no agent") and an optional title (trimmed; NUL refused)."""

    agent = forms.ModelChoiceField(queryset=Agent.objects.none())
    title = forms.CharField(max_length=200, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Read now, not when the module was imported: which workflows are installed can change meanwhile.
        self.fields["agent"].queryset = active_agents()  # type: ignore[attr-defined]


def _an_agent_not_offered(value: str) -> bool:
    return value.isascii() and value.isdigit() and len(value) <= 18 and Agent.objects.filter(pk=int(value)).exists()


@login_required
@require_POST
def chat_new(request: HttpRequest) -> HttpResponse:
    form = NewChatForm(request.POST)
    if not form.is_valid():
        # The form is two fields on the home page: its errors go back there as one message.
        if "agent" in form.errors and _an_agent_not_offered(request.POST.get("agent", "")):
            # A page that still offered it: switched off, or its workflow gone, since.
            messages.error(request, "That agent is not available now: choose another one.")
        elif "agent" in form.errors:
            messages.error(request, "Choose an agent to talk to.")
        else:
            messages.error(request, " ".join(str(e) for errors in form.errors.values() for e in errors))
        return redirect("home")
    try:
        session = session_create(user=request.user, agent=form.cleaned_data["agent"], title=form.cleaned_data["title"])
    except Exception as exc:
        refusal = runtime_error_status(exc)
        if refusal is None:
            raise
        messages.error(request, refusal[1])
        return redirect("home")
    return redirect("chat", session_id=session.pk)


# Turns on one page of the chat (the latest; earlier ones a link away).
CHAT_PAGE_TURNS = 50


# Staff who may read sessions and their turns open a person's chat read-only, with its context inspector.
STAFF_READS_CHATS = ("chat_sessions.view_chatsession", "chat_sessions.view_turn", "memory.view_memory")


def _session_to_read(request: HttpRequest, session_id: UUID) -> tuple[ChatSession, bool]:
    """The person's own session; or, for staff with ``STAFF_READS_CHATS``, anyone's (and True: read-only). 404
    otherwise, as for a session that does not exist."""
    own = own_sessions(request.user).filter(pk=session_id).first()
    if own is not None:
        return own, False
    user: Any = request.user
    if user.is_staff and user.has_perms(STAFF_READS_CHATS):
        return get_object_or_404(ChatSession.objects.select_related("agent", "user"), pk=session_id), True
    raise Http404("No such chat.")


@login_required
@require_GET
def chat(request: HttpRequest, session_id: UUID) -> HttpResponse:
    """The chat: its latest ``CHAT_PAGE_TURNS`` turns, and a link to the ones before (``?before=<seq>``). A
    long session rendered whole was seconds of markdown and megabytes of HTML (3,000 turns: 3.6 s, 2.5 MB).
    An earlier page is for reading: its composer is replaced by a link back to the latest turns."""
    session, reading_as_staff = _session_to_read(request, session_id)
    drawn = timezone.now()  # before the turns are read: what finishes meanwhile comes as an event
    before = request.GET.get("before", "")
    older = before.isascii() and before.isdigit() and 0 < len(before) <= 9
    # The tools each turn ran, marked under its reply as the live stream marks them (they vanished on reload).
    tools = Prefetch("tool_invocations", queryset=ToolInvocation.objects.order_by("id").only("turn_id", "name", "ok"))
    turns = session.turns.order_by("-seq").prefetch_related(tools)
    if older:
        turns = turns.filter(seq__lt=int(before))
    page = list(turns[: CHAT_PAGE_TURNS + 1])
    shown = page[:CHAT_PAGE_TURNS][::-1]
    unavailable = session_unavailable(session)
    versions_of_turns(session, shown)
    context = {
        "turns": shown,
        # Edit a message, regenerate a reply: on one's own chat that takes messages, at its latest page.
        "may_branch": not (reading_as_staff or older or unavailable or session.status == ChatSession.Status.CLOSED),
        "earlier_before": shown[0].seq if len(page) > CHAT_PAGE_TURNS else None,
        "reading_earlier": older,
        "model": _model_label(session.agent),
        "unavailable": unavailable,
        "reading_as_staff": reading_as_staff,
        "events_since": drawn.isoformat(),
        **_panels_context(request, session),
    }
    return render(request, "chat.html", context)


@signed_in_or_401
@require_GET
def chat_panels(request: HttpRequest, session_id: UUID) -> HttpResponse:
    """The side panels alone, re-fetched by the page after each reply."""
    session = _own_session(request, session_id)
    return render(request, "chat_panels.html", _panels_context(request, session))


@signed_in_or_401
@require_POST
def chat_stream(request: HttpRequest, session_id: UUID) -> HttpResponseBase:
    """POST a message; the reply comes back as ``text/event-stream``. CSRF token in the X-CSRFToken header."""
    session = _own_session(request, session_id)
    wait = messages_rate_wait(request)
    if wait is not None:
        response = error_response(
            code="throttled",
            message=f"Too many messages; try again in {wait} seconds.",
            status_code=429,
            details={"retry_after_seconds": wait},
        )
        response["Retry-After"] = str(wait)
        return response
    if request.content_type == "application/json":
        try:
            payload = json.loads(request.body or b"{}")
        except (ValueError, RecursionError):  # a body nested thousands deep overflows the parser's recursion
            return JsonResponse(error_body("parse_error", "The body is not valid JSON."), status=400)
        message = payload.get("message") if isinstance(payload, dict) else None
    else:
        message = request.POST.get("message")
    if not isinstance(message, str):
        return JsonResponse(error_body("invalid", "Send a message."), status=400)
    try:
        key = idempotency_key_from(request.headers)
    except ValueError as exc:
        return JsonResponse(error_body("invalid", str(exc)), status=400)
    try:
        return turn_event_response(session=session, message=message, idempotency_key=key, asynchronous=is_asgi(request))
    except Exception as exc:
        refusal = runtime_error_status(exc)
        if refusal is None:
            raise
        code, text, status = refusal
        return JsonResponse(error_body(code, text), status=status, headers=refusal_headers(exc))


@login_required
@require_POST
def chat_delete(request: HttpRequest, session_id: UUID) -> HttpResponse:
    session = _own_session(request, session_id)
    try:
        session_delete(session=session)
    except SessionBusyError:
        messages.error(request, "A reply is still being written; delete the chat when it has finished.")
        return redirect("chat", session_id=session.pk)
    messages.success(request, "Chat deleted.")
    return redirect("home")
