"""Routing by structured output only.

The model chooses an action from a closed set (a ``Literal``), with its reasoning and confidence,
at temperature 0. Free text never steers control flow: "Search", "search for more information" or
"検索する" fail validation, get one repair attempt, and end in the safe default.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from llm.base import CallContext, LLMError, LLMProvider, Message
from llm.demo import asks_for_person

logger = logging.getLogger(__name__)

RouteAction = Literal["answer", "use_tools", "search_memory", "handoff"]
SAFE_DEFAULT: RouteAction = "answer"


class RouteDecision(BaseModel):
    """What to do with the user's message. Exactly one action from the closed set."""

    action: RouteAction = Field(description="answer directly, use tools, search memory first, or hand to a human")
    reasoning: str = Field(default="", max_length=500)
    confidence: float = Field(ge=0.0, le=1.0)


@dataclass(frozen=True)
class RouteOutcome:
    action: RouteAction
    confidence: float
    reasoning: str
    # "model" (taken as chosen), "low_confidence" (below the threshold: safe default or handoff),
    # "invalid_output" / "model_error" (no valid decision: safe default).
    source: str

    def as_dict(self) -> dict[str, object]:
        return {
            "action": self.action,
            "confidence": self.confidence,
            "reasoning": self.reasoning,
            "source": self.source,
        }


ROUTER_PROMPT = (
    "Decide how to handle the user's latest message. Reply with JSON only, matching the schema: "
    '{"action": one of "answer", "use_tools", "search_memory", "handoff"; "reasoning": short; '
    '"confidence": 0..1}. Use "handoff" only when the user asks for a person or the request is outside '
    'what you may do. Use "use_tools" when one of the available tools is needed.'
)


def route_message(
    *,
    provider: LLMProvider,
    message: str,
    tool_names: list[str],
    ctx: CallContext,
    confidence_threshold: float = 0.4,
    low_confidence_action: RouteAction = SAFE_DEFAULT,
) -> RouteOutcome:
    """Choose an action for ``message``. Never raises for bad model output: falls back to the safe default."""
    messages: list[Message] = [
        {"role": "system", "content": f"{ROUTER_PROMPT}\nAvailable tools: {', '.join(tool_names) or 'none'}."},
        {"role": "user", "content": message},
    ]
    try:
        decision = provider.structured(messages, schema=RouteDecision, ctx=ctx)
    except LLMError as exc:
        source = "invalid_output" if exc.outcome == "invalid_output" else "model_error"
        logger.warning("routing fell back to %s: %s", SAFE_DEFAULT, exc)
        return RouteOutcome(SAFE_DEFAULT, 0.0, f"no valid decision ({exc.outcome})", source)
    action = decision.action
    if action in ("use_tools", "search_memory") and not tool_names:
        action = SAFE_DEFAULT
    if decision.confidence < confidence_threshold:
        return RouteOutcome(low_confidence_action, decision.confidence, decision.reasoning, "low_confidence")
    return RouteOutcome(action, decision.confidence, decision.reasoning, "model")


def demo_route(messages: list[Message]) -> RouteDecision | None:
    """The offline demo model's routing: a hand-off when the user asks for a person; otherwise nothing (the
    demo's generic answer, which routes to the safe default)."""
    user = next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user"), "")
    if asks_for_person(user):
        return RouteDecision(action="handoff", reasoning="the user asks for a person", confidence=0.9)
    return None
