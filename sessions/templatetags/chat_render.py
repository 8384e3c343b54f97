"""Template filters for the chat pages."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from sessions.rendering import markdown_to_safe_html

register = template.Library()


@register.filter
def markdown_safe(text: Any) -> SafeString:
    """Markdown rendered and sanitized by nh3 (``sessions.rendering``), so safe to insert as HTML."""
    return mark_safe(markdown_to_safe_html(str(text or "")))  # nh3 has sanitized it


@register.filter
def pretty_value(value: Any) -> str:
    """A collected slot value as a person would read it."""
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    return str(value)
