"""A browser test that fails leaves a screenshot of every page it had open, under the test run's output
(test-artifacts/failures/, git-ignored), named after the test."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FAILURES = Path(__file__).resolve().parents[2] / "test-artifacts" / "failures"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    if report.when == "call" and report.failed:
        browser = getattr(item, "funcargs", {}).get("browser")
        if browser is not None:
            FAILURES.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^\w.-]+", "_", item.nodeid.split("::", 1)[-1])
            for c, context in enumerate(browser.contexts):
                for p, page in enumerate(context.pages):
                    try:
                        page.screenshot(path=str(FAILURES / f"{name}-{c}-{p}.png"), full_page=True)
                    except Exception:  # noqa: BLE001 - a page that cannot be drawn: the report stands anyway
                        continue
    return report
