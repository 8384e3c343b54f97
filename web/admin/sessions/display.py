"""What the sessions' admin pages show alike: JSON compact in a cell or pretty in a block, and links to the
change lists of related rows."""

from __future__ import annotations

import json
from typing import Any

from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html


def compact_json(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pretty_json(value: Any, limit: int | None = None) -> str:
    """``value`` as indented JSON in a ``<pre>`` block (its first ``limit`` characters, when given)."""
    text = json.dumps(value, indent=2, sort_keys=True, default=str)
    return format_html("<pre>{}</pre>", text if limit is None else text[:limit])


def related_list_links(pk: Any, specs: tuple[tuple[str, str, str], ...]) -> str:
    """Links to admin change lists filtered on this object: (label, url name, filter field)."""
    links = []
    for label, name, query in specs:
        try:
            links.append(format_html('<a href="{}?{}={}">{}</a>', reverse(name), query, pk, label))
        except NoReverseMatch:
            continue
    return format_html(" · ".join(["{}"] * len(links)), *links) if links else "—"
