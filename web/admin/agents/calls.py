"""The logs of model calls (``LLMCallAdmin``) and tool calls (``ToolInvocationAdmin``): read-only and never
deleted here, since they are evidence; their filters offer the values the code knows."""

from __future__ import annotations

from typing import get_args

from django.contrib import admin
from django.http import HttpRequest

from agents.models import LLMCall, ToolInvocation
from agents.tools import tool_names
from agents.tools.errors import ErrorKind
from llm.base import Outcome, Purpose
from llm.demo import DemoModel
from llm.openai_compat import OpenAICompatibleProvider
from web.admin.lists import LogAdmin, known_values_filter
from web.admin.readonly import EvidenceAdmin

# The finish reasons of OpenAI-compatible endpoints (the model-call log's filter offers these).
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "function_call")


def _provider_names() -> list[str]:
    return [OpenAICompatibleProvider.name, DemoModel.name]


@admin.register(LLMCall)
class LLMCallAdmin(EvidenceAdmin, LogAdmin):
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


@admin.register(ToolInvocation)
class ToolInvocationAdmin(EvidenceAdmin, LogAdmin):
    """Every tool run, read-only: what the model asked for and the string it got back (TOOL_ERROR or not)."""

    list_display = ["name", "ok", "error_kind", "attempts", "latency_ms", "session", "turn", "created_at"]
    list_filter = [
        "ok",
        known_values_filter("name", "tool", tool_names),
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
