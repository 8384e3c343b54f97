"""Keep API keys out of error texts, call records and logs.

Error messages from HTTP clients sometimes echo request headers or URLs; a key that reaches an
``LLMCall.error`` would be shown in the admin. Everything a provider stores or logs goes through
``redact`` first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"

# Shapes of credentials we recognise even when we were not told the value: bearer tokens and the
# common "sk-…" key format (OpenAI, OpenRouter, many gateways).
_PATTERNS = [
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(?i)((?:api[_-]?key|authorization|x-api-key)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]{4,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret value and every credential-shaped token replaced."""
    for secret in secrets:
        # Short values would redact ordinary words ("x", "none"); a real key is longer.
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        if pattern.groups:
            text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
        else:
            text = pattern.sub(REDACTED, text)
    return text
