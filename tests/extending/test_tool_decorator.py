"""``@tool``: the argument schema and its validation come from the function's signature."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from agents.tools import ToolContext, ToolRegistry, run_tool_call, tool
from agents.tools.decorator import tool_from_function
from llm.base import ToolCallRequest


@tool
def add_days(start: str, days: Annotated[int, Field(ge=1, le=30, description="days to add, 1 to 30")] = 7) -> str:
    """Add days to a date (YYYY-MM-DD)."""
    return f"{start}+{days}"


def _run(registry: ToolRegistry, name: str, arguments: str, user: Any = None) -> Any:
    return run_tool_call(
        call=ToolCallRequest(id="c1", name=name, arguments=arguments),
        context=ToolContext(user=user),
        registry=registry,
    )


def test_the_schema_comes_from_the_signature_and_the_docstring() -> None:
    spec = add_days.spec()
    assert spec.name == "add_days" and spec.description == "Add days to a date (YYYY-MM-DD)."
    properties = spec.parameters["properties"]
    assert spec.parameters["required"] == ["start"]
    assert properties["start"]["type"] == "string"
    assert properties["days"]["minimum"] == 1 and properties["days"]["maximum"] == 30
    assert properties["days"]["description"] == "days to add, 1 to 30"
    assert spec.parameters["additionalProperties"] is False


def test_arguments_are_validated_and_a_bad_one_is_a_tool_error_not_an_exception() -> None:
    registry = ToolRegistry([add_days])
    assert _run(registry, "add_days", '{"start": "2026-12-01", "days": 3}').content == "2026-12-01+3"
    assert _run(registry, "add_days", '{"start": "2026-12-01"}').content == "2026-12-01+7"  # the default
    refused = _run(registry, "add_days", '{"start": "2026-12-01", "days": 99}')
    assert not refused.ok and refused.content.startswith("TOOL_ERROR") and "days" in refused.content
    unknown = _run(registry, "add_days", '{"start": "x", "weeks": 1}')
    assert not unknown.ok and "weeks" in unknown.content


def test_the_context_is_handed_in_and_is_not_an_argument(django_user_model: Any, db: Any) -> None:
    @tool
    def whoami(*, context: ToolContext) -> str:
        """Say who the tool runs for."""
        return context.user.username

    assert whoami.spec().parameters["properties"] == {}
    user = django_user_model(username="carol")
    assert _run(ToolRegistry([whoami]), "whoami", "{}", user=user).content == "carol"


class Query(BaseModel):
    text: str = Field(min_length=2, description="what to look for")


def test_a_function_of_one_pydantic_model_takes_that_model_as_its_schema() -> None:
    @tool(name="look-up", description="Look something up.", timeout_s=2.0)
    def look(query: Query) -> str:
        return query.text.upper()

    assert look.name == "look-up" and look.args_model is Query and look.timeout_s == 2.0
    assert _run(ToolRegistry([look]), "look-up", '{"text": "tea"}').content == "TEA"


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (lambda x: x, "needs a description"),
        (lambda *args: None, "cannot be described"),
    ],
)
def test_what_cannot_be_a_tool_is_refused_when_it_is_defined(function: Any, message: str) -> None:
    function.__doc__ = None if message == "needs a description" else "Takes anything."
    with pytest.raises(ValueError, match=message):
        tool_from_function(function, name="t")
    with pytest.raises(ValueError, match="letters, digits"):
        tool_from_function(add_days.run, name="has spaces", description="x")


def test_a_type_that_cannot_be_resolved_is_named_when_the_tool_is_defined() -> None:
    class Local(BaseModel):
        x: int

    def uses_local(arg: Local) -> str:
        """Uses a class only this test knows."""
        return ""

    uses_local.__annotations__["arg"] = "Local"  # as ``from __future__ import annotations`` leaves it
    with pytest.raises(ValueError, match="cannot be resolved"):
        tool_from_function(uses_local)


def test_the_sample_in_extending_md_runs_as_written(django_user_model: Any, db: Any) -> None:
    """docs/extending.md's ``shop/tools.py`` once called an undefined ``find_order`` and had ``...`` as a body."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "extending.md").read_text()
    sample = re.search(r"```python\n(# shop/tools\.py.*?)```", page, re.S)
    assert sample is not None
    names: dict[str, Any] = {}
    exec(compile(sample.group(1), "shop/tools.py", "exec"), names)
    registry = ToolRegistry([names["order_status"], names["refund_request"]])
    assert _run(registry, "order_status", '{"order_id": "A1001"}').content.startswith("Order A1001: rain jacket")
    missing = _run(registry, "order_status", '{"order_id": "B2002"}')
    assert not missing.ok and "no order" in missing.content
    user = django_user_model(username="dora", pk=7)
    refund = _run(registry, "refund_request", '{"order_id": "A1001", "reason": "too small"}', user=user)
    assert refund.ok and refund.content.startswith("Refund R-") and refund.content.endswith("is on its way.")
