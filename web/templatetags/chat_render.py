"""Template filters for the chat pages."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

from core.text import state_words as words
from web.chat.rendering import markdown_to_safe_html

register = template.Library()


@register.filter
def markdown_safe(text: Any) -> SafeString:
    """Markdown rendered and sanitized by nh3 (``web.chat.rendering``), so safe to insert as HTML."""
    return mark_safe(markdown_to_safe_html(str(text or "")))  # nh3 has sanitized it


@register.filter
def pretty_value(value: Any) -> str:
    """A collected slot value as a person would read it."""
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    return str(value)


@register.filter
def state_words(state: Any) -> str:
    """A workflow state as words ("GATHERING_ORIGIN" → "Gathering origin"); staff pages keep the name. A
    state's declared label, where there is one, comes from the view (``Workflow.state_label``)."""
    return words(state)


# Where a memory came from in retrieval, in words a user reads (the tiers of memory.retrieval, for staff).
_TIER_WORDS = {1: "known about you", 2: "matched your message"}


@register.filter
def tier_words(tier: Any) -> str:
    try:
        return _TIER_WORDS.get(int(tier), "found")
    except (TypeError, ValueError):
        return "found"


@register.filter
def ago(moment: Any) -> str:
    """ "3 minutes ago", or "just now" for under a minute (Django's timesince said "0 minutes")."""
    if not isinstance(moment, datetime) or timezone.now() - moment < timedelta(minutes=1):
        return "just now"
    return f"{timesince(moment)} ago"
