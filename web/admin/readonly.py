"""Admins of rows the code writes (logs, records, what was learned): nothing is added or changed by hand; and
the confirmation page and permission refusal of an admin action.

``ReadOnlyAdmin``: no adding, no changing (viewing goes by the view permission); ``EvidenceAdmin``: no deleting
either, for the records kept as evidence (model calls, tool calls, turns).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.http import HttpRequest
from django.template.response import TemplateResponse


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the code writes: none is added or changed here; viewing is allowed through the view permission."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class EvidenceAdmin(ReadOnlyAdmin):
    """Records kept as evidence: not deleted here either."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def action_confirmation(
    model_admin: admin.ModelAdmin, request: HttpRequest, template: str, *, title: str, **context: Any
) -> TemplateResponse:
    """The page an admin action shows before it acts (its form posts the action again with ``confirmed=yes``)."""
    page = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        **context,
    }
    return TemplateResponse(request, template, page)


def refused_without(model_admin: admin.ModelAdmin, request: HttpRequest, permissions: Any, message: str) -> bool:
    """True, and ``message`` shown, when the user lacks one of ``permissions`` (the action then does nothing)."""
    if request.user.has_perms(permissions):
        return False
    model_admin.message_user(request, message, level=messages.ERROR)
    return True
