"""Memory curation in the Django admin: search (text, or semantic with a leading "~"), filters, pin /
archive / re-embed / merge actions, editing that re-embeds, the contradiction review queue, and a
"try retrieval" page that shows every tier's candidates for a query as a chosen user.

All memory text is rendered through Django templates and ``format_html``: it is always escaped.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.postgres.search import SearchQuery, SearchRank
from django.core.exceptions import PermissionDenied
from django.db.models import Case, F, IntegerField, Q, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from pgvector.django import CosineDistance

from agents.models import Agent
from core.incoming import Unstorable, storable_datetime
from memory.embedding import get_embedder
from memory.models import MEMORY_EDITABLE_FIELDS, Memory, MemoryReview
from memory.retrieval import memories_for_prompt, tuning
from memory.selectors import current_q
from memory.services import (
    current_duplicate,
    duplicate_message,
    memories_merge,
    memories_reembed,
    memories_set_archived,
    memories_set_pinned,
    memory_create,
    memory_update,
    merge_plan,
    review_apply,
    review_reject,
)
from web.admin.desk import desk_index, desk_user
from web.admin.lists import LogAdmin
from web.admin.readonly import action_confirmation

SEMANTIC_PREFIX = "~"
SEMANTIC_LIMIT = 50


def _admin_link(obj: Any, label: str) -> str:
    if obj is None:
        return "—"
    try:
        url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    except NoReverseMatch:
        return label
    return format_html('<a href="{}">{}</a>', url, label)


class CurrentFilter(admin.SimpleListFilter):
    title = "in force"
    parameter_name = "current"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Current"), ("no", "Superseded or expired")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Memory]) -> QuerySet[Memory]:
        if self.value() == "yes":
            return queryset.filter(current_q(timezone.now()))
        if self.value() == "no":
            return queryset.exclude(current_q(timezone.now()))
        return queryset


class MemoryForm(forms.ModelForm):
    class Meta:
        model = Memory
        fields = ["user", *MEMORY_EDITABLE_FIELDS]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "occurred_at" in self.fields:
            self.fields["occurred_at"].required = False
            self.fields["occurred_at"].help_text = "When what it tells happened. Blank: as it was (new: now)."

    def clean(self) -> dict[str, Any]:
        """One row per current text and kind for a user (the database's rule): say which row has it."""
        data = super().clean() or {}
        for name in ("occurred_at", "valid_to", "expires_at"):
            # The dates every door takes (core.incoming): one PostgreSQL stores and Python cannot read back
            # broke every list that showed it.
            if data.get(name) is not None:
                try:
                    data[name] = storable_datetime(data[name])
                except Unstorable as exc:
                    self.add_error(name, exc.reason)
                    data.pop(name, None)
        if "occurred_at" in self.fields and data.get("occurred_at") is None and "occurred_at" not in self.errors:
            data["occurred_at"] = self.instance.occurred_at if self.instance.pk else timezone.now()
        user = self.instance.user if self.instance.pk else data.get("user")  # an edit never moves a memory
        text, kind = (data.get("text") or "").strip(), data.get("kind")
        if text and kind and data.get("valid_to") is None:
            duplicate = current_duplicate(user=user, kind=kind, text=text, exclude_id=self.instance.pk)
            if duplicate is not None:
                raise forms.ValidationError(duplicate_message(duplicate))
        return data


def _search_kind(term: str) -> tuple[str, str]:
    """("semantic", query) for "~query", ("words", query) for any other text, ("", "") for nothing to search."""
    if term.startswith(SEMANTIC_PREFIX):
        query = term[len(SEMANTIC_PREFIX) :].strip()
        return ("semantic", query) if query else ("", "")
    return ("words", term.strip()) if term.strip() else ("", "")


def _word_search(queryset: QuerySet[Memory], term: str) -> QuerySet[Memory]:
    """Memories whose text has the words (the full-text index, as retrieval's word arm reads it), of the user
    with that username, with that fact key, or procedures whose trigger holds the term: each an index lookup,
    where ``icontains`` over every text read every row.
    Annotated with ``search_rank`` (how well the text matches), the list's order: ranking needs every match,
    which keeps the planner from walking the whole table in id order looking for a rare word's few rows."""
    words = SearchQuery(term, config="english", search_type="websearch")
    match = Q(search_vector=words) | Q(fact_key=term)
    # The user's id as a value, not a subquery: the planner then ORs three index scans (with a subquery it
    # reads the table in id order, testing every row).
    users = list(get_user_model().objects.filter(username__iexact=term).values_list("pk", flat=True)[:10])
    if users:
        match |= Q(user_id__in=users)
    # Procedures by a piece of their trigger ("refund" finds "refund, chargeback"): few rows, on the
    # (user, kind) index.
    procedures = list(
        Memory.objects.filter(kind=Memory.Kind.PROCEDURAL, trigger__icontains=term).values_list("pk", flat=True)[:200]
    )
    if procedures:
        match |= Q(pk__in=procedures)
    return queryset.filter(match).annotate(search_rank=SearchRank(F("search_vector"), words))


@admin.register(Memory)
class MemoryAdmin(LogAdmin):
    form = MemoryForm
    # Few columns, so the text gets the room at 1280 px beside the admin's menu (the flags are one column;
    # importance and counts are on each memory's page and the curation desk).
    list_display = ("id", "user", "kind", "short_text", "flags", "when")
    list_filter = (
        "kind",
        "pinned",
        "archived",
        "needs_review",
        CurrentFilter,
        # Every agent (a short list), not the distinct agents of the memories (a scan of the table). No user
        # list: a thousand users would make a sidebar of a thousand links; search for a username instead.
        "agent",
        "created_at",
    )
    # The full-text index (words, with stemming), a username or a fact key: see get_search_results.
    search_fields = ("text",)
    search_help_text = (
        'Words of the text (all of them; "quoted phrase", or, -not), a username, a fact key (home_city) or '
        f'part of a procedure\'s trigger; start with "{SEMANTIC_PREFIX}" for semantic search (e.g. ~where does she live).'
    )
    ordering = ("-id",)  # newest first, on the primary key
    list_select_related = ("user", "agent")
    raw_id_fields = ("user",)
    readonly_fields = (
        "source_session_link",
        "source_turn_link",
        "valid_from",
        "embedding_model",
        "content_hash",
        "access_count",
        "last_accessed_at",
        "created_at",
        "updated_at",
    )
    actions = ["pin", "unpin", "archive", "restore", "reembed", "merge_duplicates"]
    change_list_template = "admin/memory/memory/change_list.html"

    @admin.display(description="text")
    def short_text(self, obj: Memory) -> str:
        text = obj.text if len(obj.text) <= 160 else obj.text[:160] + "…"
        return f"{text} [{obj.fact_key}]" if obj.fact_key else text

    @admin.display(description="state")
    def flags(self, obj: Memory) -> str:
        flags = [
            name
            for name, on in (("pinned", obj.pinned), ("archived", obj.archived), ("to review", obj.needs_review))
            if on
        ]
        return ", ".join(flags) or "—"

    @admin.display(description="when", ordering="created_at")
    def when(self, obj: Memory) -> str:
        moment = obj.occurred_at or obj.created_at
        return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M") if moment else "—"

    @admin.display(description="session")
    def source_session_link(self, obj: Memory) -> str:
        return _admin_link(obj.source_session, str(obj.source_session) if obj.source_session else "")

    @admin.display(description="turn")
    def source_turn_link(self, obj: Memory) -> str:
        return _admin_link(obj.source_turn, f"turn #{obj.source_turn.seq}" if obj.source_turn else "")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Memory], search_term: str
    ) -> tuple[QuerySet[Memory], bool]:
        kind, query = _search_kind(search_term)
        # The change list orders before it searches: a search's own order (best match first) replaces that.
        if kind == "words":
            return _word_search(queryset, query).order_by("-search_rank", "-id"), False
        if kind != "semantic":
            return queryset, False
        vector = get_embedder().embed_query(query)
        ids = list(
            queryset.exclude(embedding__isnull=True)
            .annotate(distance=CosineDistance("embedding", vector))
            .order_by("distance")
            .values_list("id", flat=True)[:SEMANTIC_LIMIT]
        )
        order = Case(*[When(id=pk, then=Value(i)) for i, pk in enumerate(ids)], output_field=IntegerField())
        return queryset.filter(id__in=ids).annotate(semantic_rank=order).order_by("semantic_rank"), False

    def save_model(self, request: HttpRequest, obj: Memory, form: forms.ModelForm, change: bool) -> None:
        data = {name: form.cleaned_data[name] for name in form.changed_data}
        if not change:
            created = memory_create(
                user=form.cleaned_data["user"],
                kind=form.cleaned_data["kind"],
                text=form.cleaned_data["text"],
                agent=form.cleaned_data.get("agent"),
                importance=form.cleaned_data["importance"],
                pinned=form.cleaned_data["pinned"],
                fact_key=form.cleaned_data["fact_key"],
                trigger=form.cleaned_data["trigger"],
                workflow=form.cleaned_data["workflow"],
            )
            obj.pk = created.pk
            return
        # Editing goes through the service so a changed text is re-embedded.
        fresh = Memory.objects.get(pk=obj.pk)
        data.pop("user", None)  # a memory never moves to another user
        if data:
            memory_update(memory=fresh, **data)

    @admin.action(description="Pin selected memories", permissions=["change"])
    def pin(self, request: HttpRequest, queryset: QuerySet[Memory]) -> None:
        self.message_user(request, f"Pinned {memories_set_pinned(memories=queryset, pinned=True)} memories.")

    @admin.action(description="Unpin selected memories", permissions=["change"])
    def unpin(self, request: HttpRequest, queryset: QuerySet[Memory]) -> None:
        self.message_user(request, f"Unpinned {memories_set_pinned(memories=queryset, pinned=False)} memories.")

    @admin.action(description="Archive selected memories", permissions=["change"])
    def archive(self, request: HttpRequest, queryset: QuerySet[Memory]) -> None:
        self.message_user(request, f"Archived {memories_set_archived(memories=queryset, archived=True)} memories.")

    @admin.action(description="Restore selected memories", permissions=["change"])
    def restore(self, request: HttpRequest, queryset: QuerySet[Memory]) -> None:
        self.message_user(request, f"Restored {memories_set_archived(memories=queryset, archived=False)} memories.")

    @admin.action(description="Re-embed selected memories", permissions=["change"])
    def reembed(self, request: HttpRequest, queryset: QuerySet[Memory]) -> None:
        count = memories_reembed(memories=queryset.iterator(chunk_size=256))
        self.message_user(request, f"Re-embedded {count} memories with {get_embedder().name}.")

    @admin.action(description="Merge selected duplicates (one user, one kind)…", permissions=["change"])
    def merge_duplicates(self, request: HttpRequest, queryset: QuerySet[Memory]) -> HttpResponse | None:
        """First a page that shows what will change (the memory kept, its combined text, the ones archived);
        the merge happens only when that page is confirmed."""
        selected = list(queryset.select_related("user"))
        try:
            keeper, others, text = merge_plan(selected)
        except ValueError as exc:
            self.message_user(request, str(exc), level=messages.ERROR)
            return None
        if request.POST.get("confirmed") != "yes":
            return action_confirmation(
                self,
                request,
                "admin/memory/memory/merge_confirmation.html",
                title="Merge these memories?",
                keeper=keeper,
                others=others,
                combined=text,
                selected=selected,
                action="merge_duplicates",
            )
        try:
            kept = memories_merge(memories=selected, text=request.POST.get("combined"))
        except ValueError as exc:
            self.message_user(request, str(exc), level=messages.ERROR)
            return None
        self.message_user(request, f"Merged {len(selected)} memories into #{kept.pk}; the others are archived.")
        return None

    def get_urls(self) -> list[Any]:
        custom = [
            path("desk/", self.admin_site.admin_view(partial(desk_index, self)), name="memory_memory_desk"),
            path(
                "desk/<int:user_id>/",
                self.admin_site.admin_view(partial(desk_user, self)),
                name="memory_memory_desk_user",
            ),
            path(
                "try-retrieval/",
                self.admin_site.admin_view(self.try_retrieval_view),
                name="memory_memory_try_retrieval",
            ),
        ]
        return custom + super().get_urls()

    def try_retrieval_view(self, request: HttpRequest) -> HttpResponse:
        """Run the real selector as a chosen user and show every tier's candidates and scores."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = TryRetrievalForm(request.GET or None)
        result = None
        rows: list[dict[str, Any]] = []
        if form.is_valid():
            data = form.cleaned_data
            result = memories_for_prompt(
                user=data["user"],
                query=data["query"],
                agent=data.get("agent"),
                workflow=data.get("workflow") or "",
                budget_tokens=data["budget_tokens"],
                relevance_threshold=_threshold_for(data),
                use_model_filter=data["use_model_filter"],
                touch=False,  # a look from the admin is not the user's access: their counts stay as they were
            )
            texts = dict(Memory.objects.filter(id__in=[c.id for c in result.candidates]).values_list("id", "text"))
            rows = [{**c.as_dict(), "text": texts.get(c.id, c.preview)} for c in result.candidates]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Try retrieval",
            "form": form,
            "result": result,
            "rows": rows,
            "hub_weight": tuning.HUB_WEIGHT,
        }
        return TemplateResponse(request, "admin/memory/try_retrieval.html", context)


def _threshold_for(data: dict[str, Any]) -> float | None:
    """The form's cut-off, or the chosen agent's when the form leaves it blank (None: calibrated)."""
    if data.get("relevance_threshold") is not None:
        return float(data["relevance_threshold"])
    agent = data.get("agent")
    return agent.relevance_threshold if agent is not None else None


class TryRetrievalForm(forms.Form):
    user = forms.ModelChoiceField(
        queryset=get_user_model().objects.order_by("username"), help_text="Retrieve as this user."
    )
    query = forms.CharField(
        max_length=2000, widget=forms.Textarea(attrs={"rows": 2, "style": "width: 100%; box-sizing: border-box"})
    )
    agent = forms.ModelChoiceField(queryset=Agent.objects.all(), required=False)
    workflow = forms.CharField(max_length=80, required=False)
    budget_tokens = forms.IntegerField(min_value=0, max_value=100_000, initial=2000)
    relevance_threshold = forms.FloatField(
        min_value=0.0,
        max_value=1.0,
        required=False,
        help_text="Blank: the agent's setting (the calibrated filter unless it names a cut-off), as its chats use.",
    )
    use_model_filter = forms.BooleanField(required=False, initial=True)


@admin.register(MemoryReview)
class MemoryReviewAdmin(admin.ModelAdmin):
    list_display = ("id", "user", "existing_text", "proposed_text", "confidence", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("proposed_text", "existing__text", "user__username")
    list_select_related = ("user", "existing")
    readonly_fields = (
        "user",
        "existing_link",
        "proposed_text",
        "proposed_key",
        "confidence",
        "reason",
        "status",
        "source_session",
        "source_turn",
        "created_at",
        "resolved_at",
        "resolved_by",
    )
    exclude = ("existing",)
    actions = ["apply", "reject"]

    @admin.display(description="current fact")
    def existing_text(self, obj: MemoryReview) -> str:
        return obj.existing.text

    @admin.display(description="current fact")
    def existing_link(self, obj: MemoryReview) -> str:
        return _admin_link(obj.existing, obj.existing.text)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Apply: the proposed fact replaces the current one", permissions=["change"])
    def apply(self, request: HttpRequest, queryset: QuerySet[MemoryReview]) -> None:
        self._resolve_each(request, queryset, review_apply, "Applied")

    @admin.action(description="Reject: keep the current fact", permissions=["change"])
    def reject(self, request: HttpRequest, queryset: QuerySet[MemoryReview]) -> None:
        self._resolve_each(request, queryset, review_reject, "Rejected")

    def _resolve_each(
        self, request: HttpRequest, queryset: QuerySet[MemoryReview], resolve: Callable[..., Any], done_verb: str
    ) -> None:
        done = 0
        for review in queryset.filter(status=MemoryReview.Status.PENDING):
            try:
                resolve(review=review, actor=request.user)
            except ValueError as exc:  # resolved by someone else since the list was read
                self.message_user(request, str(exc), level=messages.WARNING)
                continue
            done += 1
        self.message_user(request, f"{done_verb} {done} reviews.")
