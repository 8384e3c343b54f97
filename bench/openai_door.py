"""One person's message through the OpenAI-compatible door, for ``bench concurrency``: ``POST
/v1/chat/completions`` streamed (as an OpenAI SDK or a chat UI sends it), in the person's session
(``X-Session-Id``), timed as the native stream is (``bench.concurrency.Chat``)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any


def openai_chat(
    chat: Any,
    base: str,
    token: str,
    session_id: str,
    message: str,
    start: threading.Barrier,
    t0: list[float],
    timeout: float,
    model: str = "assistant",
) -> Any:
    """Fill ``chat`` (a ``bench.concurrency.Chat``): the head, the first chunk (the turn started), the first
    content, ``[DONE]``; an error chunk or another status is a failure."""
    import httpx

    headers = {"Authorization": f"Bearer {token}", "X-Session-Id": session_id}
    body = {"model": model, "messages": [{"role": "user", "content": message}], "stream": True}
    with httpx.Client(base_url=base, timeout=timeout) as client:
        start.wait()
        try:
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                chat.status = response.status_code
                chat.accepted = time.monotonic() - t0[0]
                if response.status_code != 200:
                    chat.error = f"{response.status_code}: {response.read()[:200]!r}"
                    return chat
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        chat.done = time.monotonic() - t0[0]
                        continue
                    data = json.loads(line[6:])
                    if "error" in data:
                        chat.error = f"an error chunk: {data['error'].get('message', '')[:100]}"
                        continue
                    if chat.started is None:
                        chat.started = time.monotonic() - t0[0]
                    content = (data.get("choices") or [{}])[0].get("delta", {}).get("content")
                    if content and chat.first_token is None:
                        chat.first_token = time.monotonic() - t0[0]
        except httpx.HTTPError as exc:
            chat.error = f"{type(exc).__name__}: {exc}"
    if chat.done is None and not chat.error:
        chat.error = "the stream ended with no [DONE]"
    return chat
