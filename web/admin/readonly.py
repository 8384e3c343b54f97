"""Admins of rows the code writes (logs, records, what was learned): nothing is added or changed by hand.

``ReadOnlyAdmin``: no adding, no changing (viewing goes by the view permission); ``EvidenceAdmin``: no deleting
either, for the records kept as evidence (model calls, tool calls, turns).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


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
