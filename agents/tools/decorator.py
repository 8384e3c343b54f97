"""``@tool``: a Tool from a plain function, its argument schema and validation taken from the signature.

    from agents.tools import ToolContext, tool

    @tool
    def order_status(order_id: Annotated[str, Field(pattern=r"^A\\d{4}$")], *, context: ToolContext) -> str:
        \"\"\"Look up where an order is, by its id (A and four digits).\"\"\"
        ...

The function's name is the tool's name, its docstring the description the model reads, and every
parameter but the context a field of the argument model (type, default, ``Annotated[..., Field(...)]``
for limits and a description). A function whose one argument is a pydantic model takes that model as
is. A parameter annotated ``ToolContext`` (or named ``context``) receives who the tool runs for. The
result is a ``Tool``: list its dotted path in ``settings.AGENT_TOOLS`` (docs/extending.md).
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any, overload

from pydantic import BaseModel, ConfigDict, create_model

from agents.tools.registry import Tool, ToolContext
from core.text import camel_case

# What OpenAI-compatible endpoints accept as a function name.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@overload
def tool(func: Callable[..., object], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    max_attempts: int | None = None,
) -> Callable[[Callable[..., object]], Tool]: ...


def tool(
    func: Callable[..., object] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    max_attempts: int | None = None,
) -> Tool | Callable[[Callable[..., object]], Tool]:
    """Make a ``Tool`` of ``func`` (see the module's text); with keywords, set what the function does not say."""

    def make(target: Callable[..., object]) -> Tool:
        return tool_from_function(
            target, name=name, description=description, timeout_s=timeout_s, max_attempts=max_attempts
        )

    return make(func) if func is not None else make


def tool_from_function(
    func: Callable[..., object],
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    max_attempts: int | None = None,
) -> Tool:
    tool_name = name or func.__name__
    if not _NAME.match(tool_name):
        raise ValueError(f"tool name {tool_name!r}: use 1 to 64 letters, digits, '_' or '-'")
    text = (description if description is not None else inspect.getdoc(func) or "").strip()
    if not text:
        raise ValueError(f"tool {tool_name!r} needs a description: a docstring, or description=...")
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except NameError as exc:
        raise ValueError(
            f"tool {tool_name!r}: an argument's type cannot be resolved ({exc}); define the types a tool's "
            "arguments use at module level"
        ) from exc
    context_name = ""
    fields: dict[str, Any] = {}
    for param in inspect.signature(func).parameters.values():
        annotation = hints.get(param.name, Any)
        if annotation is ToolContext or param.name == "context":
            context_name = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"tool {tool_name!r}: *{param.name} cannot be described to a model; name each argument")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)

    whole_model = _single_model(fields)
    if whole_model is not None:
        (arg_name,) = fields
        args_model = whole_model

        def run(args: BaseModel, context: ToolContext) -> object:
            kwargs: dict[str, Any] = {arg_name: args}
            if context_name:
                kwargs[context_name] = context
            return func(**kwargs)

    else:
        args_model = create_model(
            camel_case(tool_name, default="Tool") + "Args",
            __config__=ConfigDict(extra="forbid", str_strip_whitespace=True),
            **fields,
        )

        def run(args: BaseModel, context: ToolContext) -> object:
            kwargs = {field: getattr(args, field) for field in fields}
            if context_name:
                kwargs[context_name] = context
            return func(**kwargs)

    return Tool(
        name=tool_name,
        description=text,
        args_model=args_model,
        run=run,
        timeout_s=timeout_s,
        max_attempts=max_attempts,
    )


def _single_model(fields: dict[str, Any]) -> type[BaseModel] | None:
    """The pydantic model of a function whose one argument is a model (used as the argument schema as is)."""
    if len(fields) != 1:
        return None
    ((annotation, _default),) = fields.values()
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
