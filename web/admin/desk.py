"""The curation desk: one user's memories on a page of its own for staff, in the admin's look.

A timeline (newest first, by when it happened), word and semantic search (semantic with the retriever's
reasons), each fact's earlier values (superseded, by which turn), edit in place, pin and archive, and bulk
actions that first list what will change (a merge only within one kind, previewing the combined text).
Reads need the view permission on memories, changes the change permission (``MemoryAdmin`` checks both).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.postgres.search import SearchQuery, SearchRank
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import F, QuerySet, Value
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from memory.models import Memory
from memory.retrieval import memories_for_prompt
from memory.services import memories_merge, memories_set_archived, memories_set_pinned, memory_update, merge_plan
from sessions.selectors import turn_branches

DESK_PAGE = 50
DONE = {"pin": "pinned", "unpin": "unpinned", "archive": "archived", "restore": "restored"}
BULK_ACTIONS = {
    "pin": "Pin",
    "unpin": "Unpin",
    "archive": "Archive",
    "restore": "Restore",
    "merge": "Merge (one kind)",
}


def desk_index(model_admin: Any, request: HttpRequest) -> HttpResponse:
    """Pick a user by name; the users with the most memories are offered first."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    name = request.GET.get("username", "").strip()
    if name:
        user = get_user_model().objects.filter(username__iexact=name).first()
        if user is not None:
            return HttpResponseRedirect(reverse("admin:memory_memory_desk_user", args=[user.pk]))
        messages.error(request, f"No user is called {name!r}.")
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Curation desk",
        "opts": model_admin.model._meta,
        "username": name,
    }
    return TemplateResponse(request, "admin/memory/desk_index.html", context)


def desk_user(model_admin: Any, request: HttpRequest, user_id: int) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    user = get_object_or_404(get_user_model(), pk=user_id)
    if request.method == "POST":
        return _act(model_admin, request, user)
    q = request.GET.get("q", "").strip()[:500]
    mode = "semantic" if request.GET.get("mode") == "semantic" else "words"
    theirs = Memory.objects.filter(user=user).exclude(valid_to__isnull=False, archived=False)
    found: QuerySet[Memory] = theirs.order_by("-occurred_at", "-id")
    reasons: dict[int, dict[str, Any]] = {}
    if q and mode == "words":
        words = SearchQuery(q, config="english", search_type="websearch")
        found = (
            theirs.filter(search_vector=words)
            # Divided by the text's length in words (normalization 2): ts_rank alone grows with every
            # occurrence, so a 20,000-character paste that repeats the word outranked the statement naming it.
            .annotate(rank=SearchRank(F("search_vector"), words, normalization=Value(2)))
            .order_by("-rank", "-occurred_at")
        )
    elif q:
        result = memories_for_prompt(user=user, query=q, budget_tokens=4000, touch=False)
        ranked = [c.as_dict() for c in result.candidates]
        reasons = {int(c["id"]): c for c in ranked if c.get("id") is not None}
        order = [int(c["id"]) for c in ranked if c.get("id") is not None]
        by_id = {m.pk: m for m in theirs.filter(pk__in=order)}
        found = [by_id[pk] for pk in order if pk in by_id]  # type: ignore[assignment]
    page = Paginator(found, DESK_PAGE).get_page(request.GET.get("page"))
    rows = list(page.object_list)
    keys = {m.fact_key for m in rows if m.fact_key}
    history: dict[str, list[Memory]] = defaultdict(list)
    for old in (
        Memory.objects.filter(user=user, fact_key__in=keys, valid_to__isnull=False)
        .select_related("source_turn")
        .order_by("-valid_to")
    ):
        history[old.fact_key].append(old)
    # Which branch of its chat each memory was said on, when its chat was branched (an edit, a regenerate).
    said_on = [m.source_turn_id for m in rows if m.source_turn_id]
    said_on += [old.source_turn_id for olds in history.values() for old in olds if old.source_turn_id]
    branches = turn_branches(turn_ids=said_on)
    for memory in [*rows, *(old for olds in history.values() for old in olds)]:
        memory.branch = branches.get(memory.source_turn_id) if memory.source_turn_id else None
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Memories of {user.get_username()}",
        "opts": model_admin.model._meta,
        "subject": user,
        "rows": [
            {
                "memory": m,
                "history": history.get(m.fact_key, []) if m.valid_to is None else [],
                "why": reasons.get(m.pk),
            }
            for m in rows
        ],
        "page": page,
        "q": q,
        "mode": mode,
        "counts": {
            "all": theirs.count(),
            "archived": theirs.filter(archived=True).count(),
            "pinned": theirs.filter(pinned=True).count(),
        },
        "actions": BULK_ACTIONS,
        "can_change": model_admin.has_change_permission(request),
    }
    return TemplateResponse(request, "admin/memory/desk.html", context)


def _act(model_admin: Any, request: HttpRequest, user: Any) -> HttpResponse:
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    back = request.POST.get("back") or ""
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        back = reverse("admin:memory_memory_desk_user", args=[user.pk])
    single = request.POST.get("single", "")
    if single:
        action, _, raw_id = single.partition(":")
        memory = get_object_or_404(Memory, pk=raw_id if raw_id.isdigit() else 0, user=user)
        if action == "edit":
            try:
                memory_update(memory=memory, text=request.POST.get(f"text-{memory.pk}", ""))
            except ValueError as exc:
                messages.error(request, f"#{memory.pk} not changed: {exc}")
            else:
                messages.success(request, f"#{memory.pk} changed (and embedded again).")
        elif action in ("pin", "unpin", "archive", "restore"):
            _apply(action, Memory.objects.filter(pk=memory.pk))
            messages.success(request, f"#{memory.pk} {DONE[action]}.")
        return _back_to(back, memory.pk)
    action = request.POST.get("action", "")
    ids = [int(i) for i in request.POST.getlist("ids") if i.isdigit()]
    chosen = list(Memory.objects.filter(user=user, pk__in=ids).order_by("-occurred_at"))
    if action not in BULK_ACTIONS or not chosen:
        messages.error(request, "Choose memories and an action.")
        return HttpResponseRedirect(back)
    plan: dict[str, Any] = {}
    if action == "merge":
        try:
            keeper, others, text = merge_plan(chosen)
        except ValueError as exc:
            messages.error(request, f"Not merged: {exc}")
            return HttpResponseRedirect(back)
        plan = {"keeper": keeper, "others": others, "combined": text}
    if request.POST.get("confirmed") != "yes":
        context = {
            **model_admin.admin_site.each_context(request),
            "title": f"{BULK_ACTIONS[action]} {len(chosen)} memories of {user.get_username()}?",
            "opts": model_admin.model._meta,
            "subject": user,
            "action": action,
            "label": BULK_ACTIONS[action],
            "chosen": chosen,
            "back": back,
            **plan,
        }
        return TemplateResponse(request, "admin/memory/desk_confirm.html", context)
    if action == "merge":
        try:
            kept = memories_merge(memories=chosen, text=request.POST.get("combined"))
        except ValueError as exc:
            messages.error(request, f"Not merged: {exc}")
            return HttpResponseRedirect(back)
        messages.success(request, f"Merged {len(chosen)} memories into #{kept.pk}; the others are archived.")
        return _back_to(back, kept.pk)
    changed = _apply(action, Memory.objects.filter(pk__in=[m.pk for m in chosen]))
    messages.success(request, f"{BULK_ACTIONS[action]}: {changed} of {len(chosen)} memories changed.")
    return _back_to(back, chosen[0].pk)


def _back_to(back: str, memory_id: int) -> HttpResponse:
    """Back to the page staff acted on, at the memory they acted on (the browser scrolls to the anchor): a pin
    halfway down the timeline no longer lands them at its top."""
    return HttpResponseRedirect(f"{back.split('#', 1)[0]}#memory-{memory_id}")


def _apply(action: str, memories: QuerySet[Memory]) -> int:
    if action in ("pin", "unpin"):
        return memories_set_pinned(memories=memories, pinned=action == "pin")
    return memories_set_archived(memories=memories, archived=action == "archive")
