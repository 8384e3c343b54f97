"""Workflows and tools come from settings and from installed packages' entry points; a bad entry says which."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from agents.tools.registry import default_registry, tool_names
from agents.workflows import get_workflow, registered_workflows
from tests.extending.conftest import RETURNS_TOOLS, RETURNS_WORKFLOW


def test_a_package_is_plugged_in_by_settings_alone(plug_in: Any) -> None:
    assert "returns" not in [w.name for w in registered_workflows()] and "order_status" not in tool_names()
    plug_in(workflows=RETURNS_WORKFLOW, tools=RETURNS_TOOLS)
    assert get_workflow("returns").title == "Returns and refunds"
    assert {"order_status", "refund_request", "search_memory", "book_flight"} <= set(tool_names())


def test_the_decision_schema_is_generated_from_the_declaration(plug_in: Any) -> None:
    plug_in(workflows=RETURNS_WORKFLOW)
    schema = get_workflow("returns").decision_schema
    assert schema.__name__ == "ReturnsDecision"
    states = schema.model_json_schema()["properties"]["next_state"]["enum"]
    assert states == ["ASKING_ORDER", "ASKING_REASON", "CONFIRMING", "CHECKING", "NEEDS_PERSON", "REFUNDING", "DONE"]
    decision = schema.model_validate({"next_state": "ASKING_REASON", "slots": {"order_id": "A1001"}})
    assert decision.slots.order_id == "A1001"
    with pytest.raises(ValueError):
        schema.model_validate({"next_state": "NOWHERE", "slots": {}})


@pytest.mark.parametrize(
    ("setting", "path", "message"),
    [
        ("AGENT_TOOLS", "examples.returns.tools.no_such_tool", "cannot import 'examples.returns.tools.no_such_tool'"),
        ("AGENT_TOOLS", "examples.returns.tools.find_order", "not a Tool"),
        ("AGENT_TOOLS", "examples.booking.tools.BOOK_FLIGHT", "more than one tool is named 'book_flight'"),
        ("AGENT_WORKFLOWS", "examples.returns.workflow.ReturnSlots", "not a Workflow"),
        ("AGENT_WORKFLOWS", "nowhere.at_all", "cannot import 'nowhere.at_all'"),
    ],
)
def test_a_bad_entry_in_the_settings_names_itself(plug_in: Any, setting: str, path: str, message: str) -> None:
    plug_in(**({"tools": (path,)} if setting == "AGENT_TOOLS" else {"workflows": (path,)}))
    with pytest.raises(ImproperlyConfigured, match=message):
        default_registry() if setting == "AGENT_TOOLS" else registered_workflows()


def test_an_installed_package_adds_its_tools_and_workflows_through_entry_points(
    plug_in: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real distribution's metadata on sys.path, as pip would install it: no settings change at all."""
    package = tmp_path / "shop_agents"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from agents.tools import tool\n"
        "from agents.workflows import FREE_CHAT, StateSpec, Workflow\n"
        "from pydantic import BaseModel\n\n"
        "@tool\n"
        "def shop_hours(day: str) -> str:\n"
        '    """When the shop is open on a day."""\n'
        "    return f'{day}: 9 to 5'\n\n"
        "class NoSlots(BaseModel):\n"
        "    pass\n\n"
        "GREETER = Workflow(name='greeter', title='Greeter', initial_state='HELLO',\n"
        "    specs=[StateSpec(name='HELLO', instruction='Greet.')], transitions={'HELLO': frozenset()},\n"
        "    terminal_states=frozenset(), failed_state=None, slots_model=NoSlots)\n"
    )
    dist = tmp_path / "shop_agents-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: shop-agents\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[agents_runtime.tools]\nshop_hours = shop_agents:shop_hours\n\n"
        "[agents_runtime.workflows]\ngreeter = shop_agents:GREETER\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plug_in()
    try:
        assert "shop_hours" in tool_names()
        assert get_workflow("greeter").decision_schema.__name__ == "GreeterDecision"
    finally:
        sys.modules.pop("shop_agents", None)
