"""The decision a model returns each turn of a workflow: ``WorkflowDecision`` (``next_state``, ``slots``,
``confidence``, ``reasoning``), and the schema built for one workflow from its states and slots
(``decision_schema_for``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import UnionType
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, field_validator

from core.text import camel_case


class WorkflowDecision(BaseModel):
    """What the model returns each turn. Workflows subclass it with a ``Literal`` of their states."""

    model_config = ConfigDict(extra="ignore")

    next_state: str = Field(description="The workflow state to be in after this user message.")
    slots: BaseModel = Field(description="Slot values stated by the user in this message; null when not given.")
    confidence: float = Field(default=1.0, ge=0.0, le=1.0, description="How sure you are, 0 to 1.")
    reasoning: str = Field(default="", max_length=1000, description="One short sentence: why this state.")
    wants_person: bool = Field(
        default=False, description="True only when the user asks to talk to a person (a human, not the assistant)."
    )
    # Built by code from an action's result (``Workflow.decision``), never from a model's output: only such a
    # decision may set the slots that no state collects (a booking's reference). Not in the schema; not input.
    _by_action: bool = PrivateAttr(default=False)

    @field_validator("slots", mode="before")
    @classmethod
    def _null_slots_mean_none_given(cls, value: Any) -> Any:
        # Models often send "slots": null when nothing was said; that is "no update", not an error.
        return {} if value is None else value


def decision_schema_for(name: str, states: Sequence[str], slots_model: type[BaseModel]) -> type[WorkflowDecision]:
    """The decision a model returns each turn of workflow ``name``: ``next_state`` one of ``states``, and
    ``slots`` an update in which every slot is optional and loosely typed (a number stays a number, a date or
    a constrained string is a string): the slots' own types and checks run when the update is merged
    (``Workflow.merge_slots``), so that one bad value is reported and dropped instead of voiding the rest."""
    camel = camel_case(name, default="Workflow")
    update_fields: dict[str, Any] = {
        slot: (_loose(field.annotation), Field(default=None, description=field.description))
        for slot, field in slots_model.model_fields.items()
    }
    state_type: Any = Literal[tuple(states)]
    update = create_model(f"{camel}SlotsUpdate", __config__=ConfigDict(extra="ignore"), **update_fields)
    return create_model(
        f"{camel}Decision",
        __base__=WorkflowDecision,
        next_state=(state_type, Field(description="The workflow state to be in after this user message.")),
        slots=(
            update,
            Field(default_factory=update, description="Slot values stated in this message; null when not given."),
        ),
    )


def decided_reply_schema(decision_schema: type[WorkflowDecision]) -> type[WorkflowDecision]:
    """The decision with the reply after it: one structured output for a turn whose decision travels inside its
    reply's call (``BaseProvider.stream_structured``): the decision's fields first, then ``reply``, the text the user
    reads, streamed while it is written (``llm.provider_base.decided.REPLY_FIELD``)."""
    return create_model(
        f"{decision_schema.__name__}AndReply",
        __base__=decision_schema,
        needs_tool=(
            bool,
            Field(default=False, description="True only when your reply needs one of the tools you were told of."),
        ),
        # No maxLength: the reply's tokens bound it, and a schema-constrained server (llama.cpp) turns a long one
        # into a grammar it cannot serve (llama-cpp-python's server drops the stream).
        reply=(
            str,
            Field(description="Your reply to the user, written after the decision, as the state you chose asks."),
        ),
    )


def _loose(annotation: Any) -> Any:
    """The JSON type a model writes for a slot of type ``annotation``, optional (see ``decision_schema_for``)."""
    base = annotation
    while True:
        origin = get_origin(base)
        if origin is Annotated:
            base = get_args(base)[0]
        elif origin in (Union, UnionType):
            options = [arg for arg in get_args(base) if arg is not type(None)]
            base = options[0] if len(options) == 1 else str
        else:
            break
    if get_origin(base) is list or base is list:
        return Optional[list[Any]]  # noqa: UP045 - a type built at run time, not an annotation
    # Any JSON scalar: a number where a string was meant (or the reverse) is the slot's check to refuse,
    # value by value, not a reason to void the whole decision.
    return Optional[Union[str, int, float, bool]]  # noqa: UP007, UP045 - built at run time
