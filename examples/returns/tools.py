"""The returns agent's tools, each a plain function made a tool by ``@tool``, and its eligibility rule.

The order book is a stand-in for your shop's API: three fixed orders, dated relative to today, so the
example (and its tests) can be run any day. The refund rule is plain Python (``refund_decision``), run by
the workflow's CHECKING state (``check_eligibility``) before the model is offered ``refund_request``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Annotated

from django.utils import timezone
from pydantic import Field

from agents.tools import ToolContext, ToolInputError, ToolOutput, tool
from agents.workflows import ActionContext, ActionFailed

RETURN_WINDOW_DAYS = 30
# Refunds above this are for a person to approve: the tool refuses them and says so.
AUTOMATIC_REFUND_LIMIT_EUR = 200.0

OrderId = Annotated[str, Field(pattern=r"^[A-Za-z]\d{4}$", description="the order number, a letter and 4 digits")]


@dataclass(frozen=True)
class Order:
    order_id: str
    item: str
    amount_eur: float
    delivered: date


def _orders(today: date) -> dict[str, Order]:
    return {
        "A1001": Order("A1001", "rain jacket", 89.0, today - timedelta(days=10)),
        "A1002": Order("A1002", "road bike", 1450.0, today - timedelta(days=5)),
        "A1003": Order("A1003", "tent", 120.0, today - timedelta(days=60)),
    }


def find_order(order_id: str, *, today: date | None = None) -> Order:
    order = _orders(today or timezone.localdate()).get(order_id.upper())
    if order is None:
        raise ToolInputError(f"there is no order {order_id!r}; ask the user to check the number.")
    return order


def refund_decision(order: Order, *, today: date) -> str:
    """Why ``order`` cannot be refunded automatically, or "" when it can (the eligibility rule)."""
    if (today - order.delivered).days > RETURN_WINDOW_DAYS:
        return f"it was delivered {order.delivered.isoformat()}, more than {RETURN_WINDOW_DAYS} days ago"
    if order.amount_eur > AUTOMATIC_REFUND_LIMIT_EUR:
        return f"refunds over EUR {AUTOMATIC_REFUND_LIMIT_EUR:.0f} are approved by a person"
    return ""


@tool
def order_status(order_id: OrderId) -> str:
    """Look up an order: what it was, what it cost and when it was delivered."""
    order = find_order(order_id)
    return f"Order {order.order_id}: {order.item}, EUR {order.amount_eur:.2f}, delivered {order.delivered.isoformat()}."


def check_eligibility(context: ActionContext) -> dict[str, str]:
    """The workflow's Python action: a refund the rule allows goes on to REFUNDING; one it does not (too old,
    or over the automatic limit) raises ``ActionFailed``, and the workflow hands the chat to a person."""
    today = timezone.localdate()
    order = find_order(str(context.data.get("order_id", "")), today=today)
    refusal = refund_decision(order, today=today)
    if refusal:
        raise ActionFailed(f"order {order.order_id}: {refusal}")
    return {}


@tool
def refund_request(
    order_id: OrderId,
    reason: Annotated[str, Field(min_length=3, max_length=300, description="why the user returns it")],
    *,
    context: ToolContext,
) -> ToolOutput:
    """Refund an order the user returns. Only for an order the user has confirmed."""
    today = timezone.localdate()
    order = find_order(order_id, today=today)
    refusal = refund_decision(order, today=today)  # checked again: the model may call it in another state
    if refusal:
        return ToolOutput(
            text=f"Order {order.order_id} cannot be refunded automatically: {refusal}.",
            data={"refund_refused": refusal},
        )
    # The same request (user, order) always gets the same reference: a retried call refunds once.
    user_id = getattr(context.user, "pk", "")
    reference = "R-" + hashlib.sha256(f"{user_id}:{order.order_id}".encode()).hexdigest()[:8].upper()
    return ToolOutput(
        text=f"Refund {reference} of EUR {order.amount_eur:.2f} for order {order.order_id} is on its way.",
        data={"refund_reference": reference},
    )
