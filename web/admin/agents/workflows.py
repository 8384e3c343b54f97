"""Workflows as data in the admin (``WorkflowDefinitionAdmin``): the declaration, checked on save, each change a
new version (listed inline); a save over someone else's newer version is refused. The add form starts from
``EXAMPLE_DECLARATION``."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from agents.models import Agent, WorkflowDefinition, WorkflowVersion
from agents.workflow_store import workflow_definition_save
from sessions.models import ChatSession

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


class DeclarationField(forms.JSONField):
    """A declaration shown as indented JSON, one key a line (Django's field shows it as one long line); read,
    checked and saved as before."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value  # what staff typed, as they typed it, with the error
        return json.dumps(value, ensure_ascii=False, indent=2, cls=self.encoder)


class WorkflowDefinitionForm(forms.ModelForm):
    """The definition, with the version it was loaded at: a save over someone else's newer one is refused."""

    loaded_version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = WorkflowDefinition
        fields = ["name", "is_active", "spec"]
        field_classes = {"spec": DeclarationField}
        # Room for a declaration, in a fixed-width font (the default textarea is 10 rows of prose).
        widgets = {"spec": forms.Textarea(attrs={"rows": 40, "cols": 100, "style": "font-family: monospace"})}

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
