"""The agents' admin (``AgentAdmin``): an agent's prompt, model, context budget, workflow and tools, with the
workflows, registered tools and model profiles it may choose offered by name."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest

from agents.models import Agent
from agents.tools import tool_names
from agents.workflows import workflow_choices


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
            names = tool_names()
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
