"""The chat page's branches: edit a sent message or regenerate a reply (both fork the chat at that turn; the
page then sends the message on the new branch), and move between the versions of a turn (‹ 1/2 ›).

Doors only: ``sessions.services.session_fork`` and ``branch_switch`` do the work. Another user's chat is a 404,
as everywhere in the chat.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.api_errors import error_body, refusal_headers, runtime_error_status
from sessions.models import ChatSession, Turn
from sessions.selectors import branch_versions, own_sessions
from sessions.services import branch_switch, session_fork
from web.chat.signed_in import signed_in_or_401


def _turn_id_from(request: HttpRequest) -> int | None:
    try:
        payload = json.loads(request.body or b"{}")
    except (ValueError, RecursionError):
        return None
    turn = payload.get("turn_id") if isinstance(payload, dict) else None
    return turn if isinstance(turn, int) and not isinstance(turn, bool) and 0 < turn < 2**63 else None


@signed_in_or_401
@require_POST
def chat_fork(request: HttpRequest, session_id: UUID) -> HttpResponseBase:
    """Fork the chat at one of its turns (``{"turn_id": id}``, as the page knows them): the new branch's id and
    page (the script sends the edited message, or the same one, there)."""
    session = get_object_or_404(own_sessions(request.user), pk=session_id)
    turn_id = _turn_id_from(request)
    turn = Turn.objects.filter(session=session, pk=turn_id).first() if turn_id is not None else None
    if turn is None:
        return JsonResponse(error_body("not_found", "This chat has no such message."), status=404)
    try:
        branch = session_fork(session=session, at_turn=turn.seq, actor=request.user)
    except Exception as exc:
        refusal = runtime_error_status(exc)
        if refusal is None:
            raise
        code, text, status = refusal
        return JsonResponse(error_body(code, text), status=status, headers=refusal_headers(exc))
    return JsonResponse(
        {"session_id": str(branch.pk), "url": reverse("chat", args=[branch.pk])},
        status=201,
    )


@signed_in_or_401
@require_POST
def chat_switch(request: HttpRequest, session_id: UUID) -> HttpResponseBase:
    """Move the chat to this branch (a version chosen): every open page of the chat follows."""
    session = get_object_or_404(own_sessions(request.user), pk=session_id)
    branch_switch(session=session)
    return JsonResponse({"session_id": str(session.pk), "url": reverse("chat", args=[session.pk])})


def versions_of_turns(session: ChatSession, turns: list[Turn]) -> None:
    """Set ``versions`` on each of ``turns`` that has more than one (an edited message, a regenerated reply):
    which one it is of how many, and the branches of the one before and after, for the page's ‹ 1/2 ›."""
    found = branch_versions(session=session)
    for turn in turns:
        version = found.get(turn.seq)
        info: dict[str, Any] | None = None
        if version is not None:
            i = version.index - 1
            info = {
                "index": version.index,
                "total": version.total,
                "previous": version.sessions[i - 1] if i > 0 else None,
                "next": version.sessions[i + 1] if i + 1 < version.total else None,
            }
        turn.versions = info  # type: ignore[attr-defined]
