"""``http_get``: fetch a URL for the model, within a host allow-list, a timeout and a size limit.

The allow-list is ``settings.TOOLS_HTTP_ALLOWED_HOSTS``: exact host names, ``.example.com`` for a
domain and its subdomains, or ``*`` for any host whose addresses are all public. A host that is not
listed is refused before anything is resolved or connected to. Private, loopback and link-local
addresses are reachable only through a host listed by name (so ``*`` cannot reach the intranet).
Redirects are followed by hand, each hop checked again.

Known limit: with ``*`` the name is resolved for the check and again by the HTTP client, so a DNS
server that answers differently the second time (DNS rebinding) could slip past it; list exact hosts
where that matters.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import httpx
from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agents.tools.decorator import tool
from agents.tools.errors import ToolConnectionError, ToolHttpError, ToolInputError
from agents.tools.registry import ToolContext

MAX_REDIRECTS = 3
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml", "+json", "+xml")
_USER_AGENT = "agents-runtime http_get tool"


def _schema_with_current_limit(schema: dict[str, Any], model: type[BaseModel]) -> None:
    # The limit comes from settings at the time the model is shown the tool, not at import.
    prop = schema.get("properties", {}).get("max_bytes", {})
    for option in prop.get("anyOf", [prop]):
        if option.get("type") == "integer":
            option["maximum"] = int(settings.TOOLS_HTTP_MAX_BYTES)


class HttpGetArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, json_schema_extra=_schema_with_current_limit)

    url: str = Field(min_length=10, max_length=2000, description="Absolute http:// or https:// URL to fetch.")
    max_bytes: int | None = Field(
        default=None, ge=1, description="Read at most this many bytes of the body (default: the server's limit)."
    )

    @field_validator("url")
    @classmethod
    def _absolute_http_url(cls, value: str) -> str:
        try:
            url = httpx.URL(value)
        except (httpx.InvalidURL, TypeError) as exc:
            raise ValueError(f"not a valid URL ({exc})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an absolute http:// or https:// URL")
        return value

    @field_validator("max_bytes")
    @classmethod
    def _within_limit(cls, value: int | None) -> int | None:
        limit = int(settings.TOOLS_HTTP_MAX_BYTES)
        if value is not None and value > limit:
            raise ValueError(f"must be at most {limit} (the server's limit)")
        return value


def host_permission(host: str, port: int) -> None:
    """Raise ``ToolInputError`` unless ``host`` may be fetched; resolves only hosts allowed by ``*``."""
    host = host.lower().rstrip(".")
    allowed = [entry.lower().rstrip(".") for entry in settings.TOOLS_HTTP_ALLOWED_HOSTS]
    listed = any(
        host == entry or (entry.startswith(".") and (host.endswith(entry) or host == entry[1:])) for entry in allowed
    )
    if listed:
        return
    if "*" not in allowed:
        shown = ", ".join(e for e in allowed) or "none"
        raise ToolInputError(
            f"the host {host!r} is not on the allow-list, so it was refused without connecting. Allowed hosts: {shown}."
        )
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolConnectionError(f"cannot resolve {host!r} ({exc})") from None
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not address.is_global:
            raise ToolInputError(
                f"the host {host!r} resolves to a non-public address ({address}); refused without connecting."
            )


def _read_limited(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    body = bytearray()
    for chunk in response.iter_bytes(chunk_size=16384):
        body.extend(chunk)
        if len(body) > limit:
            # Stop reading: leaving the stream closes the connection instead of downloading the rest.
            return bytes(body[:limit]), True
    return bytes(body), False


def _decode(body: bytes, response: httpx.Response) -> str:
    try:
        return body.decode(response.charset_encoding or "utf-8", errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


@tool(
    description=(
        "Fetch a web page or API response by URL (GET) and return its status and text, cut to a size limit. "
        "Only allow-listed hosts can be fetched."
    )
)
def http_get(args: HttpGetArgs, context: ToolContext) -> str:
    limit = args.max_bytes or int(settings.TOOLS_HTTP_MAX_BYTES)
    url = httpx.URL(args.url)
    # trust_env=False: proxy variables must not route requests around the allow-list.
    with httpx.Client(
        timeout=httpx.Timeout(float(settings.TOOLS_HTTP_TIMEOUT)),
        follow_redirects=False,
        trust_env=False,
        # identity: a compressed body could expand far past the size limit in one chunk.
        headers={"User-Agent": _USER_AGENT, "Accept-Encoding": "identity"},
    ) as client:
        for hop in range(MAX_REDIRECTS + 1):
            host_permission(url.host, url.port or (443 if url.scheme == "https" else 80))
            with client.stream("GET", url) as response:
                location = response.headers.get("location")
                if response.is_redirect and location and hop < MAX_REDIRECTS:
                    next_url = url.join(location)
                    if next_url.scheme not in ("http", "https"):
                        raise ToolInputError(f"redirected to a non-http URL ({next_url.scheme}:)")
                    url = next_url
                    continue
                body, truncated = _read_limited(response, limit)
                status = response.status_code
                reason = response.reason_phrase
                content_type = response.headers.get("content-type", "")
                if status >= 400:
                    snippet = " ".join(_decode(body[:200], response).split())
                    raise ToolHttpError(status, f"{reason}; {snippet}" if snippet else reason)
                header = [f"HTTP {status} {reason}", f"URL: {url}", f"Content-Type: {content_type or 'unknown'}"]
                if location:
                    header.append(f"Location: {location}")
                if body and not any(marker in content_type.lower() for marker in _TEXT_TYPES) and content_type:
                    return "\n".join([*header, "", f"[binary body of {len(body)} bytes not shown]"])
                text = _decode(body, response)
                if truncated:
                    text += f"\n[truncated: the body is larger than {limit} bytes; only the first {limit} are shown]"
                return "\n".join([*header, "", text])
    raise ToolInputError(f"more than {MAX_REDIRECTS} redirects")  # pragma: no cover - the loop always returns


# The name settings.AGENT_TOOLS uses.
HTTP_GET = http_get
