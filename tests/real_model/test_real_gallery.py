"""The failure gallery's 60-turn script on the real model server (``make test-llm``), with the same faults.

What the architecture guarantees is asserted: no crash, no cut-off reply shown as whole, no early fact lost,
a flat prompt. What depends on the model's wits (mis-routes, repeated questions, wrong branches) is reported:
printed, and written to ``GALLERY_REAL_OUTPUT`` when set (``python -m bench gallery -- --markdown
--real-model FILE`` puts it in the table of docs/reliability.md beside the demo model's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench.gallery import FACTS, real_model_gallery
from llm.profiles import EndpointProfile
from tests.real_model.conftest import TOOLS_MODEL, LlamaServer

pytestmark = [pytest.mark.llm, pytest.mark.django_db(transaction=True)]

# The booking agent's reply budget on this 4,096-token model: room for the prompt, and replies long enough to
# be cut off by the limit now and then (the model's own cut-offs, continued like the injected ones).
REPLY_TOKENS = 96


def test_the_failure_gallery_on_the_real_model(alice: Any, llama_server: LlamaServer, settings: Any) -> None:
    profile = llama_server.profile(model=TOOLS_MODEL)
    settings.LLM_PROFILES = {"default": profile}  # the agent's budget follows the server's window
    result = real_model_gallery(
        user=alice, profile=EndpointProfile.from_mapping("default", profile), max_tokens=REPLY_TOKENS
    )
    app = result["agents"]["app"]
    output = os.environ.get("GALLERY_REAL_OUTPUT")
    if output:
        Path(output).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    report = {key: app[key] for key in ("repeated_detail", "misroute_detail", "other_wrong_branches", "cut_off_detail")}
    print(json.dumps({**report, "prompt_tokens": app["prompt_tokens"], "seconds": app["seconds"]}, indent=1))

    assert result["turns"] == 60
    assert app["crashes"] == 0, app["crash_errors"]
    assert all(result["replies"]["app"]), "a turn with no reply"
    # Every cut-off reply (injected, or the model's own at the limit) reached the user whole or marked cut off.
    assert app["cut_replies_shown"] == 0, app["cut_off_detail"]
    assert {d["continuation"] for d in app["cut_off_detail"] if d["continuation"]} == {
        "continued",
        "cut_again",
        "empty",
        "repeats",
    }
    assert app["lost_data"] == [], app["facts_at_last_turn"]
    assert len(app["facts_at_last_turn"]) == len(FACTS)
    assert app["prompt_growth_per_turn"] < 2
