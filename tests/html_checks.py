"""What in HTML could run code, found by parsing it as a browser would rather than by searching its text:
escaped text that reads ``<img onerror=...>`` is harmless and, for a user who wrote it, the right thing to
show."""

from __future__ import annotations

from html.parser import HTMLParser

ACTIVE_TAGS = {"script", "iframe", "img", "object", "embed", "svg", "math", "form", "input", "frame", "style"}
URL_ATTRIBUTES = {"href", "src", "action", "formaction"}


class _Finder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.handlers: list[str] = []
        self.script_urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ACTIVE_TAGS:
            self.tags.append(tag)
        for name, value in attrs:
            if name.startswith("on"):
                self.handlers.append(f"<{tag} {name}>")
            url = (value or "").strip().lower()
            if name in URL_ATTRIBUTES and url.startswith(("javascript:", "vbscript:", "data:text/html")):
                self.script_urls.append(f"<{tag} {name}={value!r}>")


def _parse(html: str) -> _Finder:
    finder = _Finder()
    finder.feed(html)
    finder.close()
    return finder


def active_parts(fragment: str) -> list[str]:
    """Elements, event handlers and script URLs of a rendered fragment (a reply, a memory): none belong."""
    found = _parse(fragment)
    return found.tags + found.handlers + found.script_urls


def script_urls(page: str) -> list[str]:
    """``javascript:`` (and the like) links or sources of a whole page: the templates have none."""
    return _parse(page).script_urls
