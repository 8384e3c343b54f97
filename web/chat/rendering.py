"""Model output and memories as safe HTML: markdown rendered on the server, then sanitized.

Anything a model or a user wrote is untrusted. ``markdown`` turns it into HTML, with raw HTML in the
input escaped (shown as the text it is: "use the <div> tag" keeps its tag name, and an unclosed
``<iframe`` or ``<textarea`` cannot swallow the rest of the reply), and ``nh3`` then keeps only a small
allow-list of tags and attributes, so a reply that contains ``<script>`` or ``onerror=`` shows up as
text, never as code.
"""

from __future__ import annotations

import html as html_lib
import re
from typing import Any

import markdown as markdown_lib
import nh3
from markdown.extensions import Extension

ALLOWED_TAGS = {
    "p", "br", "hr", "strong", "em", "b", "i", "code", "pre", "blockquote",
    "ul", "ol", "li", "a", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "tr", "th", "td", "del", "sub", "sup", "kbd",
}  # fmt: skip
ALLOWED_ATTRIBUTES: dict[str, set[str]] = {"a": {"href", "title"}, "code": {"class"}}


class _RawHtmlAsText(Extension):
    """Python-Markdown passes raw HTML through; without its two HTML readers it is escaped like any text."""

    def extendMarkdown(self, md: Any) -> None:
        md.preprocessors.deregister("html_block")
        md.inlinePatterns.deregister("html")


# Lines indented deeper than this are not markdown a person or a model writes: Python-Markdown nests a list a
# level per four spaces and recurses per level (400 levels: a RecursionError; 2,000: 48 s, then the error).
MAX_INDENT = 80
# Inline tags models write in replies (a <br> in a table cell, <sup>2</sup>), bare: outside code, their escaped
# form is made a tag again, for nh3 to check like the rest. With any attribute they stay text.
_INLINE_TAG = re.compile(r"&lt;(/?)(br|b|i|em|strong|sub|sup|kbd)\s*/?&gt;", re.IGNORECASE)
_CODE = re.compile(r"(<pre>.*?</pre>|<code>.*?</code>)", re.DOTALL)


def _as_tag(match: re.Match[str]) -> str:
    return f"<{match.group(1)}{match.group(2).lower()}>"


def _plain(text: str) -> str:
    return "<p>" + html_lib.escape(text).replace("\n", "<br>\n") + "</p>"


def markdown_to_safe_html(text: str) -> str:
    """Markdown to HTML with only harmless tags left; links get ``rel="noopener noreferrer nofollow"``.

    Raw HTML shows as text, except bare inline tags models write (``<br>`` in a table cell, ``<sup>``).
    Text too deeply nested for the markdown parser is shown as plain text."""
    text = text or ""
    if any(len(line) - len(line.lstrip(" \t")) > MAX_INDENT for line in text.splitlines()):
        return _plain(text)
    try:
        html = markdown_lib.markdown(
            text, extensions=["fenced_code", "tables", "sane_lists", _RawHtmlAsText()], output_format="html"
        )
    except RecursionError:
        return _plain(text)
    # Outside code, the bare inline tags a model wrote (_INLINE_TAG) are tags again.
    html = "".join(
        part if part.startswith(("<code", "<pre")) else _INLINE_TAG.sub(_as_tag, part) for part in _CODE.split(html)
    )
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
