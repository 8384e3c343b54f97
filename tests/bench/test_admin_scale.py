from __future__ import annotations

import pytest

from agents.models import LLMCall, ToolInvocation
from bench.admin_scale import PAGES, _seed, _time_pages
from memory.models import Memory
from sessions.models import ChatSession, Checkpoint, Turn


@pytest.mark.django_db
def test_the_seed_fills_every_log_and_every_measured_page_loads() -> None:
    _seed(2000)

    assert Turn.objects.count() == Checkpoint.objects.count() == LLMCall.objects.count() == 2001
    assert ToolInvocation.objects.count() == 401 and Memory.objects.count() == 1001
    assert ChatSession.objects.count() == 20
    assert Checkpoint.objects.filter(state="GATHERING_ORIGIN").count() == 40
    assert Memory.objects.filter(fact_key="home_city", valid_to__isnull=True).count() == 1
    pages = _time_pages()  # raises on a page that is not a 200
    assert [p["page"] for p in pages] == [label for label, _ in PAGES]
    assert all(p["median_ms"] > 0 and p["queries"] > 0 for p in pages)
