from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from observability.models import Alert, AlertRule
from observability.services import alerts_resolve_manually


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ("name", "metric", "threshold", "window_minutes", "min_samples", "per_agent", "enabled")
    list_editable = ("threshold", "window_minutes", "enabled")
    list_filter = ("enabled", "metric")
    search_fields = ("name", "description")


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("rule", "scope", "value", "last_value", "threshold", "window_minutes", "fired_at", "resolved_at")
    list_filter = (("resolved_at", admin.EmptyFieldListFilter), "rule")
    date_hierarchy = "fired_at"
    readonly_fields = (
        "rule",
        "agent",
        "value",
        "last_value",
        "threshold",
        "window_minutes",
        "details",
        "fired_at",
        "notified_at",
    )
    actions = ["resolve_now"]

    @admin.display(description="Scope")
    def scope(self, obj: Alert) -> str:
        return obj.scope_label

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Alerts are fired by the evaluator, not typed in.
        return False

    @admin.action(description="Mark selected alerts resolved", permissions=["change"])
    def resolve_now(self, request: HttpRequest, queryset: QuerySet[Alert]) -> None:
        count = alerts_resolve_manually(alert_ids=list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"{count} alert(s) resolved.")
