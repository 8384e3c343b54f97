"""Slot values: what a decision says merged into what a workflow collected (``slots_merge``), each value checked
by the slots model on its own and then against the rest, and a refused value said in words a person reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date
from typing import Any

from pydantic import BaseModel, ValidationError


def slots_merge(
    slots_model: type[BaseModel],
    data: Mapping[str, Any],
    update: BaseModel | Mapping[str, Any] | None,
    *,
    workflow_name: str,
    today: date | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Merge ``update`` into ``data`` (``Workflow.merge_slots``): every valid value is kept, every invalid one
    reported and dropped; ``workflow_name`` names the workflow in the report of a name that is not a slot."""
    if update is None:
        raw: dict[str, Any] = {}
    elif isinstance(update, BaseModel):
        raw = update.model_dump(exclude_none=True)
    else:
        raw = {k: v for k, v in update.items() if v is not None}
    merged = {k: v for k, v in data.items()}
    errors: list[str] = []
    fresh: dict[str, Any] = {}
    context = {"today": today, "check_past": True}
    for name, value in raw.items():
        if name not in slots_model.model_fields:
            errors.append(f"{name}: not a slot of {workflow_name}")
            continue
        try:
            single = slots_model.model_validate({name: value}, context=context)
        except ValidationError as exc:
            errors.append(_first_error(name, exc))
            continue
        fresh[name] = single.model_dump(mode="json")[name]
    together = {**merged, **fresh}
    if _consistent(slots_model, together, today=today):
        return together, errors
    # Some new value clashes with the data (or with another new value): admit them one by one.
    for name, value in fresh.items():
        candidate = {**merged, name: value}
        try:
            slots_model.model_validate(_known(slots_model, candidate), context={"today": today, "check_past": False})
        except ValidationError as exc:
            errors.append(_first_error(name, exc))
            continue
        merged = candidate
    return merged, errors


def _consistent(slots_model: type[BaseModel], data: Mapping[str, Any], *, today: date | None) -> bool:
    try:
        slots_model.model_validate(_known(slots_model, data), context={"today": today, "check_past": False})
    except ValidationError:
        return False
    return True


def _known(slots_model: type[BaseModel], data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in slots_model.model_fields}


_MONTHS = ("January February March April May June July August September October November December").split()
_ISO_DAY = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")


def _first_error(name: str, exc: ValidationError) -> str:
    """The first validation error of a slot, in words a person reads ("at most 9", "there is no 31 February"),
    not pydantic's ("Input should be less than or equal to 9")."""
    first: Mapping[str, Any] = exc.errors()[0] if exc.errors() else {"msg": str(exc)}
    kind, ctx, value = first.get("type", ""), first.get("ctx") or {}, first.get("input")
    bounds = {
        "less_than_equal": "at most",
        "greater_than_equal": "at least",
        "less_than": "below",
        "greater_than": "above",
    }
    if kind in bounds:
        limit = next(iter(ctx.values()), "")
        return f"{name}: {bounds[kind]} {limit}"
    if kind in ("date_from_datetime_parsing", "date_parsing", "date_type") and isinstance(value, str):
        day = _ISO_DAY.match(value)
        if day and 1 <= int(day.group(2)) <= 12:
            return f"{name}: there is no {int(day.group(3))} {_MONTHS[int(day.group(2)) - 1]}"
        return f"{name}: {value!r} is not a date"
    if kind in ("int_parsing", "int_from_float"):
        return f"{name}: a whole number, please"
    return f"{name}: {first.get('msg', 'invalid value')}"
