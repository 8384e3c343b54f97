"""Settings that plug a package in, with the registries rebuilt around each test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agents.tools.registry import default_registry_reset
from agents.workflows import registry_reset


@pytest.fixture
def plug_in(settings: Any) -> Iterator[Any]:
    """``plug_in(workflows=[...], tools=[...])``: add dotted paths to ``AGENT_WORKFLOWS`` / ``AGENT_TOOLS``, as
    an operator's settings would; the registries are built again from them (and again after the test)."""

    def plug(*, workflows: tuple[str, ...] = (), tools: tuple[str, ...] = ()) -> None:
        settings.AGENT_WORKFLOWS = [*settings.AGENT_WORKFLOWS, *workflows]
        settings.AGENT_TOOLS = [*settings.AGENT_TOOLS, *tools]
        registry_reset()
        default_registry_reset()

    yield plug
    registry_reset()
    default_registry_reset()


RETURNS_WORKFLOW = ("examples.returns.workflow.RETURNS",)
RETURNS_TOOLS = ("examples.returns.tools.order_status", "examples.returns.tools.refund_request")
