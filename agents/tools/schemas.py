"""A tool's argument schema as the model sees it: pydantic's JSON schema, cleaned for OpenAI-style function
calling (``parameters_schema``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def parameters_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The pydantic JSON schema of ``model``, cleaned for OpenAI-style function calling.

    Inlines ``$ref``s, drops ``title``s, turns ``Optional[X] = None`` into plain ``X`` (the field is
    simply not required) and forbids extra properties.
    """
    schema = model.model_json_schema()  # afresh: a tool's schema may show a limit read from the settings
    defs = schema.pop("$defs", {})
    cleaned = _clean_schema(schema, defs)
    cleaned["type"] = "object"
    cleaned.setdefault("properties", {})
    cleaned["required"] = list(cleaned.get("required", []))
    cleaned["additionalProperties"] = False
    return cleaned


def _clean_schema(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_clean_schema(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs.get(str(node["$ref"]).rsplit("/", 1)[-1], {})
        return _clean_schema({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key == "properties" and isinstance(value, dict):
            # Keys here are field names (a field may be called "title"), not schema keywords.
            out[key] = {name: _clean_schema(sub, defs) for name, sub in value.items()}
        else:
            out[key] = _clean_schema(value, defs)
    any_of = out.get("anyOf")
    if isinstance(any_of, list) and len(any_of) == 2 and {"type": "null"} in any_of:
        other = next(option for option in any_of if option != {"type": "null"})
        del out["anyOf"]
        out = {**other, **out}
        if out.get("default", 0) is None:
            del out["default"]
    return out
