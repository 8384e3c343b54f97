"""The models agents use: connecting an OpenAI-compatible endpoint (``ModelEndpointAdmin``, "Save and test"),
and what each endpoint was found to take for structured outputs (``EndpointCapabilityAdmin``, read-only)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from agents.endpoints import endpoint_test, ollama_models, ollama_url
from agents.models import EndpointCapability, ModelEndpoint
from web.admin.readonly import ReadOnlyAdmin


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
class EndpointCapabilityAdmin(ReadOnlyAdmin):
    """What each model endpoint was found to take for structured outputs. Learned by the calls themselves;
    delete a row to have it learned again (after a server upgrade, say)."""

    list_display = ["profile", "model", "base_url", "structured_mode", "learned_at"]
    list_filter = ["structured_mode", "profile"]
    search_fields = ["profile", "model", "base_url"]

    def get_readonly_fields(self, request: HttpRequest, obj: EndpointCapability | None = None) -> list[str]:
        return [f.name for f in EndpointCapability._meta.fields]
