from __future__ import annotations

from typing import Any, get_args

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from rest_framework.authtoken.admin import TokenAdmin
from rest_framework.authtoken.models import TokenProxy

from agents.endpoints import endpoint_test, ollama_models, ollama_url
from agents.models import (
    Agent,
    EndpointCapability,
    LLMCall,
    ModelEndpoint,
    ToolInvocation,
    WorkflowDefinition,
    WorkflowVersion,
)
from agents.tools import tool_names
from agents.tools.errors import ErrorKind
from agents.workflow_store import workflow_definition_save
from agents.workflows import workflow_choices
from llm.base import Outcome, Purpose
from llm.demo import DemoModel
from llm.openai_compat import OpenAICompatibleProvider
from people.erasure import person_erase
from sessions.locks import SessionBusyError
from sessions.models import ChatSession
from web.admin.lists import LogAdmin, known_values_filter
from web.api.agents import export_download

# The finish reasons of OpenAI-compatible endpoints (the model-call log's filter offers these).
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "function_call")


def _provider_names() -> list[str]:
    return [OpenAICompatibleProvider.name, DemoModel.name]


def _tool_names() -> list[str]:
    return tool_names()


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "endpoint_display", "model", "workflow", "is_active", "updated_at"]
    list_filter = ["is_active", "workflow", "endpoint"]
    search_fields = ["name", "slug", "description"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["created_at", "updated_at"]
    fieldsets = [
        (None, {"fields": ["name", "slug", "description", "is_active"]}),
        ("Prompt", {"fields": ["system_prompt"]}),
        (
            "Model",
            {
                "fields": ["endpoint", "model", "temperature", "max_tokens"],
                "description": (
                    "The endpoint is the name of a profile from the server's settings (LLM_PROFILES); "
                    "its API key stays in the server's environment and is never stored here. "
                    "Blank: the default profile, or the offline demo model when none is configured."
                ),
            },
        ),
        (
            "Context budget",
            {
                "fields": [
                    "context_window",
                    "response_reserve",
                    "safety_margin",
                    "section_budgets",
                    "window_turns",
                    "memory_budget_tokens",
                    "relevance_threshold",
                ]
            },
        ),
        (
            "Workflow and tools",
            {
                "fields": [
                    "workflow",
                    "routing_confidence_threshold",
                    "tools",
                    "step_limit",
                    "step_limit_behaviour",
                ]
            },
        ),
        ("History", {"fields": ["created_at", "updated_at"], "classes": ["collapse"]}),
    ]

    @admin.display(description="Endpoint", ordering="endpoint")
    def endpoint_display(self, obj: Agent) -> str:
        if obj.endpoint:
            return obj.endpoint
        return "default" if "default" in (getattr(settings, "LLM_PROFILES", {}) or {}) else "demo model"

    def get_form(self, request: HttpRequest, obj: Agent | None = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        workflow = form.base_fields.get("workflow")
        if workflow is not None:
            # The workflows agents may follow by name: the code's, the settings', the admin's.
            choices = workflow_choices()
            if obj is not None and obj.workflow not in {name for name, _title in choices}:
                choices.append((obj.workflow, f"{obj.workflow} (not available)"))
            workflow.widget = forms.Select(choices=[(name, f"{title} ({name})") for name, title in choices])
        if "tools" in form.base_fields:
            # The registered tools to tick (it was a raw JSON box); one the agent has that is no longer
            # registered is shown as such, and the save refuses it until it is unticked (Agent.clean).
            names = _tool_names()
            had = obj.tools if obj is not None and isinstance(obj.tools, list) else []
            gone = [t for t in had if isinstance(t, str) and t not in names]
            form.base_fields["tools"] = forms.MultipleChoiceField(
                choices=[(name, name) for name in names] + [(name, f"{name} (not available)") for name in gone],
                required=False,
                widget=forms.CheckboxSelectMultiple,
                help_text="The registered tools this agent may call.",
            )
        field = form.base_fields.get("endpoint")
        if field is not None:
            # Profile names only: a profile's settings (and the name of its key variable) stay on the server.
            names = sorted(getattr(settings, "LLM_PROFILES", {}) or {})
            field.help_text = "Configured profiles: " + (", ".join(names) or "none (the demo model answers)") + "."
        return form


@admin.register(LLMCall)
class LLMCallAdmin(LogAdmin):
    """Every model call, as recorded: read-only, since it is evidence."""

    list_display = [
        "created_at",
        "purpose",
        "agent",
        "provider",
        "model",
        "outcome",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "latency_ms",
        "ttft_ms",
        "retries",
    ]
    list_filter = [
        known_values_filter("outcome", "outcome", lambda: get_args(Outcome)),
        known_values_filter("purpose", "purpose", lambda: get_args(Purpose)),
        known_values_filter("provider", "provider", _provider_names),
        known_values_filter("finish_reason", "finish reason", lambda: FINISH_REASONS),
        "agent",
        "created_at",
    ]
    search_fields = ["model", "error", "=session__id"]
    list_select_related = ["agent"]
    ordering = ["-created_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: LLMCall | None = None) -> list[str]:
        return [f.name for f in LLMCall._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: LLMCall | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: LLMCall | None = None) -> bool:
        return False


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(admin.ModelAdmin):
    """Connect a model: an OpenAI-compatible endpoint, kept as a profile in the database. “Save and test”
    calls it for real and shows what it supports. The key stays in the environment variable named here."""

    change_form_template = "admin/agents/modelendpoint/change_form.html"
    list_display = ["name", "model", "base_url", "api_key_env", "tested"]
    fields = ["name", "base_url", "model", "api_key_env", "context_window"]

    # Where every conversation goes, with which key: superusers only (a model permission is not enough: an
    # endpoint of one's own with another variable's name would be sent that variable's value).
    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_change_permission(self, request: HttpRequest, obj: ModelEndpoint | None = None) -> bool:
        return bool(request.user.is_superuser)

    def has_delete_permission(self, request: HttpRequest, obj: ModelEndpoint | None = None) -> bool:
        return bool(request.user.is_superuser)

    @admin.display(description="last test")
    def tested(self, obj: ModelEndpoint) -> str:
        if not obj.last_test:
            return "not tested"
        return ("works" if obj.last_test.get("ok") else "failed") + f" ({obj.last_test.get('checked_at', '')})"

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial = super().get_changeform_initial_data(request)
        models = ollama_models()
        if models is not None and "base_url" not in initial:
            # A local Ollama answers: offered as the first choice (the operator can change every field).
            initial.setdefault("base_url", f"{ollama_url()}/v1")
            if models:
                initial.setdefault("model", models[0])
        return initial

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> Any:
        extra = dict(extra_context or {})
        if object_id is None and request.method == "GET":
            models = ollama_models()
            extra["ollama"] = {"url": ollama_url(), "models": models} if models is not None else None
        configured = sorted(getattr(settings, "LLM_PROFILES", {}) or {})
        extra["environment_profiles"] = configured
        return super().changeform_view(request, object_id, form_url, extra)

    def response_add(
        self, request: HttpRequest, obj: ModelEndpoint, post_url_continue: str | None = None
    ) -> HttpResponse:
        if "_test" in request.POST:
            return self._tested(request, obj)
        return super().response_add(request, obj, post_url_continue)

    def response_change(self, request: HttpRequest, obj: ModelEndpoint) -> HttpResponse:
        if "_test" in request.POST:
            return self._tested(request, obj)
        return super().response_change(request, obj)

    def _tested(self, request: HttpRequest, obj: ModelEndpoint) -> HttpResponse:
        result = endpoint_test(obj)
        if result.get("ok"):
            mode = result.get("structured", {}).get("mode_label", "")
            messages.success(request, f"{obj.model} at {obj.base_url} answers; structured outputs: {mode}.")
        else:
            messages.error(request, f"{obj.model} at {obj.base_url} did not pass the test: see the result below.")
        return HttpResponseRedirect(reverse("admin:agents_modelendpoint_change", args=[obj.pk]))


@admin.register(EndpointCapability)
class EndpointCapabilityAdmin(admin.ModelAdmin):
    """What each model endpoint was found to take for structured outputs. Learned by the calls themselves;
    delete a row to have it learned again (after a server upgrade, say)."""

    list_display = ["profile", "model", "base_url", "structured_mode", "learned_at"]
    list_filter = ["structured_mode", "profile"]
    search_fields = ["profile", "model", "base_url"]

    def get_readonly_fields(self, request: HttpRequest, obj: EndpointCapability | None = None) -> list[str]:
        return [f.name for f in EndpointCapability._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: EndpointCapability | None = None) -> bool:
        return False


@admin.register(ToolInvocation)
class ToolInvocationAdmin(LogAdmin):
    """Every tool run, read-only: what the model asked for and the string it got back (TOOL_ERROR or not)."""

    list_display = ["name", "ok", "error_kind", "attempts", "latency_ms", "session", "turn", "created_at"]
    list_filter = [
        "ok",
        known_values_filter("name", "tool", _tool_names),
        known_values_filter("error_kind", "error kind", lambda: get_args(ErrorKind)),
        "created_at",
    ]
    search_fields = ["=name", "result", "=session__id"]
    list_select_related = ["session", "turn"]
    ordering = ["-id"]  # newest first, on the primary key
    readonly_fields = [
        "session",
        "turn",
        "name",
        "arguments",
        "result",
        "ok",
        "error_kind",
        "attempts",
        "latency_ms",
        "created_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# What the add form starts from: a small workflow that saves as it is, to be edited (docs/extending.md).
EXAMPLE_DECLARATION: dict[str, Any] = {
    "title": "Callback request",
    "initial_state": "ASKING_PHONE",
    "slots": {
        "phone": {"type": "string", "pattern": "^\\+?[0-9 ]{6,20}$", "description": "a phone number"},
        "topic": {"type": "string", "min_length": 3, "description": "what the call is about"},
    },
    "states": [
        {
            "name": "ASKING_PHONE",
            "instruction": "Find out which number to call back.",
            "collects": ["phone"],
            "question": "Which number should we call?",
        },
        {
            "name": "ASKING_TOPIC",
            "instruction": "Find out what the call is about.",
            "collects": ["topic"],
            "requires": ["phone"],
            "question": "What is it about?",
        },
        {
            "name": "DONE",
            "instruction": "Tell the user we will call {phone} about: {topic}.",
            "requires": ["phone", "topic"],
        },
    ],
    "transitions": {
        "ASKING_PHONE": ["ASKING_TOPIC"],
        "ASKING_TOPIC": ["ASKING_PHONE", "DONE"],
        "DONE": ["ASKING_PHONE"],
    },
    "terminal_states": ["DONE"],
    "complete_state": "DONE",
}


class WorkflowVersionInline(admin.TabularInline):
    model = WorkflowVersion
    fields = ["version", "created_at"]
    readonly_fields = ["version", "created_at"]
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class WorkflowDefinitionForm(forms.ModelForm):
    """The definition, with the version it was loaded at: a save over someone else's newer one is refused."""

    loaded_version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = WorkflowDefinition
        fields = ["name", "is_active", "spec"]
        # Room for a declaration, in a fixed-width font (the default textarea is 10 rows of prose).
        widgets = {"spec": forms.Textarea(attrs={"rows": 24, "cols": 100, "style": "font-family: monospace"})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["loaded_version"].initial = self.instance.version

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.instance.pk is not None:
            current = WorkflowDefinition.objects.filter(pk=self.instance.pk).values_list("version", flat=True).first()
            if data.get("loaded_version") is not None and current != data["loaded_version"]:
                raise forms.ValidationError(
                    f"Someone saved this workflow since you opened it (it is at version {current} now, you opened "
                    f"version {data['loaded_version']}). Copy your changes, reload the page and apply them again."
                )
        return data


@admin.register(WorkflowDefinition)
class WorkflowDefinitionAdmin(admin.ModelAdmin):
    """Workflows as data: the declaration is checked on save, and each change is a new version."""

    form = WorkflowDefinitionForm
    list_display = ["name", "title", "version", "is_active", "updated_at"]
    list_filter = ["is_active"]
    search_fields = ["name"]
    inlines = [WorkflowVersionInline]
    fieldsets = [
        (None, {"fields": ["name", "is_active", "version", "loaded_version"]}),
        (
            "Declaration",
            {
                "fields": ["spec"],
                "description": (
                    "JSON: title, initial_state, slots (type string, integer, number, boolean or date; pattern, "
                    "min_length, max_length, minimum, maximum, choices, description), states (name, instruction, "
                    "collects, requires, accepts, question), transitions, terminal_states, handoff_states, "
                    "failed_state, complete_state, actions ({state: {tool, success, failure}}). Unknown or "
                    "unreachable states, "
                    "unknown slots and unknown tools are refused. Saving a change makes a new version: new "
                    "sessions start on it, running ones keep theirs."
                ),
            },
        ),
        ("History", {"fields": ["created_at", "updated_at"], "classes": ["collapse"]}),
    ]

    @admin.display(description="Title")
    def title(self, obj: WorkflowDefinition) -> str:
        return str((obj.spec or {}).get("title", "")) if isinstance(obj.spec, dict) else ""

    def get_readonly_fields(self, request: HttpRequest, obj: WorkflowDefinition | None = None) -> list[str]:
        # Sessions and agents refer to it by name: a saved name stays.
        return ["version", "created_at", "updated_at", *(["name"] if obj is not None else [])]

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        return {"spec": EXAMPLE_DECLARATION, **super().get_changeform_initial_data(request)}

    def save_model(self, request: HttpRequest, obj: WorkflowDefinition, form: Any, change: bool) -> None:
        workflow_definition_save(definition=obj)

    def has_delete_permission(self, request: HttpRequest, obj: WorkflowDefinition | None = None) -> bool:
        # A session or an agent on it would lose its workflow: switch it off instead (is_active).
        if obj is not None and (
            ChatSession.objects.filter(workflow=obj.name, workflow_version__isnull=False).exists()
            or Agent.objects.filter(workflow=obj.name).exists()
        ):
            return False
        return super().has_delete_permission(request, obj)


# What exporting and erasing a person reach: the data's own permissions, not only the user admin's.
EXPORT_PERMISSIONS = ("chat_sessions.view_chatsession", "chat_sessions.view_turn", "memory.view_memory")
ERASE_PERMISSIONS = ("chat_sessions.delete_chatsession", "memory.delete_memory")


class PersonAdmin(UserAdmin):
    """Django's user admin, with the erasure of a person's data (``people.erasure``) as an action."""

    actions = ["export_person", "erase_people"]  # (with the site-wide "delete selected")

    @admin.action(description="Export the selected person's data (JSON Lines)", permissions=["view"])
    def export_person(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponseBase | None:
        if not request.user.has_perms(EXPORT_PERMISSIONS):
            self.message_user(
                request, "Exporting needs the view permissions on sessions, turns and memories.", level=messages.ERROR
            )
            return None
        people = list(queryset[:2])
        if len(people) != 1:
            self.message_user(request, "Select one person to export.", level=messages.ERROR)
            return None
        return export_download(people[0])

    @admin.action(description="Erase everything kept about the selected people…", permissions=["change"])
    def erase_people(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        if not request.user.has_perms(ERASE_PERMISSIONS):
            self.message_user(
                request, "Erasing needs the delete permissions on sessions and memories.", level=messages.ERROR
            )
            return None
        people = list(queryset)
        if request.POST.get("confirmed") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": "Erase everything kept about these people?",
                "opts": self.model._meta,
                "people": people,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
            }
            return TemplateResponse(request, "admin/auth/user/erase_confirmation.html", context)
        erased = 0
        for person in people:
            try:
                person_erase(user=person, actor=request.user)
                erased += 1
            except SessionBusyError as exc:
                self.message_user(request, f"{person.get_username()}: not erased: {exc}", level=messages.ERROR)
        self.message_user(request, f"Erased the data of {erased} person(s); their accounts stay.")
        return None


class TokenKeyHiddenAdmin(TokenAdmin):
    """DRF's token admin without the keys in plain text: a key is a password to the user's data. The list and
    the token's page show its first four characters; the whole key is shown once, in the message after it
    is added (for staff to hand it over)."""

    list_display = ("key_hint", "user", "created")

    @admin.display(description="key")
    def key_hint(self, obj: Any) -> str:
        return f"{obj.key[:4]}…"

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        token = self.get_object(request, object_id)
        hint = {"subtitle": f"{token.key[:4]}… of {token.user}"} if token is not None else {}
        return super().change_view(request, object_id, form_url, {**hint, **(extra_context or {})})


if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)
admin.site.register(TokenProxy, TokenKeyHiddenAdmin)


User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)
admin.site.register(User, PersonAdmin)
