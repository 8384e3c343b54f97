from __future__ import annotations

from typing import Any, get_args

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest

from agents.llm.base import Outcome, Purpose
from agents.llm.demo import DemoModel
from agents.llm.openai_compat import OpenAICompatibleProvider
from agents.models import Agent, LLMCall, ToolInvocation
from agents.tools import tool_names
from agents.tools.errors import ErrorKind
from config.admin_lists import LogAdmin, known_values_filter

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
