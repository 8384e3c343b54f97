"""What the sessions' admin pages show alike: JSON compact in a cell or pretty in a block, and links to the
change lists of related rows."""

from __future__ import annotations

import json
from typing import Any

from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from sessions.selectors import chat_branches


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


def branch_summary(session: Any) -> str:
    """Where a session stands among its chat's branches, with links to them: "branch 2 of 3 of its chat, made from
    <its parent> at turn #1; the others: ...". "—" for a chat never branched."""
    branches = list(chat_branches(session=session).values_list("pk", flat=True))
    if len(branches) < 2 and session.parent_id is None:
        return "—"

    def link(pk: Any, label: str) -> str:
        return format_html('<a href="{}">{}</a>', reverse("admin:chat_sessions_chatsession_change", args=[pk]), label)

    number = branches.index(session.pk) + 1 if session.pk in branches else 1
    parts = [format_html("branch {} of {} of its chat", number, len(branches))]
    if session.parent_id is not None:
        parts.append(format_html("made from {} at turn #{}", link(session.parent_id, "its parent"), session.fork_seq))
    elif session.fork_seq is not None:
        parts.append(format_html("made at turn #{} (the branch it was made from is deleted)", session.fork_seq))
    others = [link(pk, f"branch {i}") for i, pk in enumerate(branches, start=1) if pk != session.pk]
    if others:
        parts.append(format_html("the others: {}", format_html(", ".join(["{}"] * len(others)), *others)))
    return format_html("; ".join(["{}"] * len(parts)), *parts)
