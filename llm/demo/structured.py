"""The demo model's structured outputs: a registered handler's instance of the schema asked for (or of a base class
it inherits), else a generic valid instance built from the schema alone.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from llm.base import Message
from llm.demo.registry import answer_structured, reply_prompt_after, structured_handlers
from llm.demo.replies import demo_reply
from llm.provider_base.decided import REPLY_FIELD, streams_reply

logger = logging.getLogger(__name__)


def structured_instance(schema: type[BaseModel], messages: list[Message]) -> BaseModel:
    """A registered handler's instance of ``schema`` (or of a base class it inherits), else a generic one. A
    structured reply (``streams_reply``): the decision a handler gives, then the reply the demo would give to the
    prompt that follows it (``register_reply_prompt_handler``)."""
    if streams_reply(schema):
        return _decided_reply(schema, messages)
    return _handled(schema, messages) or generic_instance(schema)


def _decided_reply(schema: type[BaseModel], messages: list[Message]) -> BaseModel:
    """A handler's decision (else the schema's generic fields), then the demo's reply to the prompt that would
    follow it (a registered ``ReplyPromptHandler``'s, else the prompt as it is)."""
    decided = _handled(schema, messages, validate=False)
    prompt = reply_prompt_after(schema, messages, decided) if decided is not None else None
    reply = demo_reply(prompt if prompt is not None else messages, None)
    fields = decided.model_dump(mode="json") if decided is not None else generic_instance(schema).model_dump()
    try:
        return schema.model_validate({**fields, REPLY_FIELD: reply.text})
    except ValidationError:
        logger.exception("the demo's structured reply does not fit %s", schema.__name__)
        return generic_instance(schema)


def _handled(schema: type[BaseModel], messages: list[Message], *, validate: bool = True) -> BaseModel | None:
    """A registered handler's instance (as a model's JSON would give it, when ``validate``), else None."""
    handlers = structured_handlers()
    for klass in schema.__mro__:
        handler = handlers.get(klass) if isinstance(klass, type) else None
        if handler is None:
            continue
        try:
            result = answer_structured(handler, schema, messages)
        except Exception:
            logger.exception("demo structured handler for %s failed", klass.__name__)
            break
        if result is None or not validate:
            return result
        try:
            # Round-trip through JSON so the caller gets exactly what a model's JSON would give.
            return schema.model_validate_json(result.model_dump_json())
        except ValidationError:
            logger.exception("demo structured handler for %s returned an invalid object", klass.__name__)
            break
    return None


def generic_instance(schema: type[BaseModel]) -> BaseModel:
    """A valid instance built from the schema alone: defaults, first Literal choice, minimum values, empties."""
    return schema.model_validate(_model_data(schema, depth=0))


def _model_data(schema: type[BaseModel], *, depth: int) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name, info in schema.model_fields.items():
        key = info.alias or name
        if not info.is_required():
            continue
        data[key] = _value_for(info.annotation, info, depth=depth)
    return data


def _value_for(annotation: Any, info: FieldInfo | None, *, depth: int) -> Any:
    metadata = list(info.metadata) if info is not None else []
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return _value_for(args[0], FieldInfo.from_annotation(annotation), depth=depth)
    if origin is Literal:
        return args[0]
    if origin in (Union, types.UnionType):
        if type(None) in args:
            return None
        return _value_for(args[0], info, depth=depth)
    if origin in (list, set, frozenset, tuple) or annotation in (list, set, frozenset, tuple):
        size = _min_length(metadata)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return [_value_for(a, None, depth=depth + 1) for a in args]
        item = args[0] if args else str
        return [_value_for(item, None, depth=depth + 1) for _ in range(size)]
    if origin is dict or annotation is dict:
        return {}
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return _model_data(annotation, depth=depth + 1) if depth < 8 else {}
        if issubclass(annotation, enum.Enum):
            return next(iter(annotation)).value
        if annotation is bool:
            return False
        if issubclass(annotation, int):
            return int(_lower_bound(metadata, step=1))
        if issubclass(annotation, float):
            return float(_lower_bound(metadata, step=0.01))
        if issubclass(annotation, str):
            return "x" * _min_length(metadata)
        if annotation is dt.datetime:
            return dt.datetime.now(dt.UTC).isoformat()
        if annotation is dt.date:
            return dt.date.today().isoformat()
    return None


def _min_length(metadata: list[Any]) -> int:
    for item in metadata:
        if isinstance(item, annotated_types.MinLen):
            return int(item.min_length)
    return 0


def _lower_bound(metadata: list[Any], *, step: float) -> float:
    value = 0.0
    upper: float | None = None
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            value = _as_float(item.ge)
        elif isinstance(item, annotated_types.Gt):
            value = _as_float(item.gt) + step
        elif isinstance(item, annotated_types.Le):
            upper = _as_float(item.le)
        elif isinstance(item, annotated_types.Lt):
            upper = _as_float(item.lt) - step
    if upper is not None and value > upper:
        value = upper
    return value


def _as_float(bound: Any) -> float:
    return float(bound)
