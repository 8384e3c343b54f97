"""API shapes of chat sessions, their turns, state and checkpoints."""

from __future__ import annotations

from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import exceptions, serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from agents.models import Agent
from agents.workflows import get_workflow
from core.text import state_words
from sessions.models import ChatSession, Checkpoint, Turn
from web.api.fields import StrictCharField


class NoSuchAgent(exceptions.NotFound):
    """The agent named is not one of the active agents: a 404 naming the field, as for any object not found."""


class AgentSlugField(serializers.SlugRelatedField[Agent]):
    """An agent by slug. PostgreSQL cannot compare text with NUL bytes, so such input is refused up front."""

    default_error_messages = {"does_not_exist": "No active agent has the slug {value}."}

    def to_internal_value(self, data: Any) -> Agent:
        if isinstance(data, str) and "\x00" in data:
            raise serializers.ValidationError("Null characters are not allowed.")
        return super().to_internal_value(data)


AGENT_ID_MAX = 2**63 - 1


@extend_schema_field(
    {
        "oneOf": [
            {"type": "integer", "minimum": 0, "maximum": AGENT_ID_MAX},
            {"type": "string", "pattern": "^[0-9]{1,18}$", "description": "The id's digits."},
        ]
    }
)
class AgentIdField(serializers.PrimaryKeyRelatedField[Agent]):
    """An agent by id: a whole number, or its digits as a string. DRF's field takes 1.9 for agent 1, and
    1e400 (JSON's infinity) for a database error (500)."""

    default_error_messages = {"does_not_exist": "No active agent has the id {pk_value}."}

    def to_internal_value(self, data: Any) -> Agent:
        whole = isinstance(data, int) and not isinstance(data, bool)
        # Digits only, and not thousands of them (int() refuses past 4,300 digits: a ValueError, a 500).
        digits = isinstance(data, str) and data.isascii() and data.isdigit() and len(data) <= 19
        if not whole and not digits:
            self.fail("incorrect_type", data_type=type(data).__name__)
        pk: Any = int(data)
        if pk > AGENT_ID_MAX:  # past bigint: not an id
            raise serializers.ValidationError(f"An agent id is at most {AGENT_ID_MAX}.")
        return super().to_internal_value(pk)


class SessionInputSerializer(serializers.Serializer[Any]):
    agent = AgentSlugField(
        slug_field="slug",
        queryset=Agent.objects.filter(is_active=True),
        required=False,
        help_text="The agent's slug (or give agent_id).",
    )
    agent_id = AgentIdField(queryset=Agent.objects.filter(is_active=True), required=False)
    title = StrictCharField(max_length=200, required=False, allow_blank=True, default="")

    def is_valid(self, *, raise_exception: bool = False) -> bool:
        """An agent that is not (or no longer) active is a 404 naming the field; any other refusal a 400."""
        valid = super().is_valid()
        if not valid and raise_exception:
            errors = self.errors
            missing = {name: [str(e) for e in found] for name, found in errors.items() if _not_found(found)}
            if missing and len(missing) == len(errors):
                raise NoSuchAgent(missing)
            raise serializers.ValidationError(errors)
        return valid

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        agent = attrs.get("agent") or attrs.get("agent_id")
        if agent is None:
            raise serializers.ValidationError({"agent": "Give the agent's slug (agent) or id (agent_id)."})
        return {"agent": agent, "title": attrs.get("title", "")}


def _not_found(errors: Any) -> bool:
    return isinstance(errors, list) and all(getattr(e, "code", None) == "does_not_exist" for e in errors)


class SessionOutputSerializer(serializers.ModelSerializer[ChatSession]):
    agent: serializers.SlugRelatedField[Agent] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    agent_name = serializers.CharField(source="agent.name", read_only=True)
    chat_id = serializers.UUIDField(
        read_only=True, help_text="The chat this session is a branch of (its own id when never branched)."
    )
    parent_session = serializers.UUIDField(
        source="parent_id", read_only=True, allow_null=True, help_text="The branch this one was forked from."
    )
    fork_turn = serializers.IntegerField(
        source="fork_seq",
        read_only=True,
        allow_null=True,
        help_text="The parent's turn this branch replaces: the turns before it were copied.",
    )

    class Meta:
        model = ChatSession
        fields = [
            "id",
            "title",
            "agent",
            "agent_name",
            "workflow",
            "state",
            "data",
            "status",
            "retry_count",
            "chat_id",
            "parent_session",
            "fork_turn",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class SessionForkInputSerializer(serializers.Serializer[Any]):
    turn = serializers.IntegerField(
        min_value=1,
        max_value=2**31 - 1,
        help_text="The turn (its seq) the new branch replaces: it starts from the checkpoint taken before it.",
    )


class SessionStateSerializer(serializers.ModelSerializer[ChatSession]):
    states = serializers.SerializerMethodField()
    terminal_states = serializers.SerializerMethodField()
    workflow_title = serializers.SerializerMethodField()
    state_labels = serializers.SerializerMethodField()

    class Meta:
        model = ChatSession
        fields = [
            "id",
            "workflow",
            "workflow_title",
            "state",
            "data",
            "status",
            "retry_count",
            "version",
            "last_transition",
            "last_good_state",
            "states",
            "terminal_states",
            "state_labels",
            "updated_at",
        ]
        read_only_fields = fields

    def _workflow(self, session: ChatSession) -> Any:
        # Read once per session (a workflow declared as data is a database read).
        cache: dict[Any, Any] = self.__dict__.setdefault("_workflows", {})
        if session.pk not in cache:
            try:
                cache[session.pk] = get_workflow(session.workflow, session.workflow_version)
            except (ImportError, LookupError, KeyError, ValueError):
                # A workflow removed from the code since the session began: show the state without the map.
                cache[session.pk] = None
        return cache[session.pk]

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_states(self, session: ChatSession) -> list[str]:
        workflow = self._workflow(session)
        return list(workflow.states) if workflow is not None else []

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_terminal_states(self, session: ChatSession) -> list[str]:
        workflow = self._workflow(session)
        return sorted(workflow.terminal_states) if workflow is not None else []

    @extend_schema_field(serializers.DictField(child=serializers.CharField()))
    def get_state_labels(self, session: ChatSession) -> dict[str, str]:
        """Each state as people read it (the workflow's label, or the name in words)."""
        workflow = self._workflow(session)
        if workflow is None:
            return {session.state: state_words(session.state)}
        return {state: workflow.state_label(state) for state in workflow.states}

    @extend_schema_field(serializers.CharField())
    def get_workflow_title(self, session: ChatSession) -> str:
        workflow = self._workflow(session)
        return str(getattr(workflow, "title", "") or session.workflow)


class CheckpointOutputSerializer(serializers.ModelSerializer[Checkpoint]):
    class Meta:
        model = Checkpoint
        fields = ["id", "seq", "turn", "state", "data", "retry_count", "transition", "reason", "detail", "created_at"]
        read_only_fields = fields


class TurnOutputSerializer(serializers.ModelSerializer[Turn]):
    session = serializers.UUIDField(source="session_id", read_only=True)
    error = serializers.SerializerMethodField(
        help_text="Why the turn failed, as told to the user (empty unless failed). The internal reason is for staff, "
        "in the admin."
    )

    class Meta:
        model = Turn
        fields = [
            "id",
            "session",
            "seq",
            "user_message",
            "assistant_message",
            "status",
            "error",
            "state_before",
            "state_after",
            "steps",
            "step_limit_hit",
            "truncated",
            "is_demo",
            "prompt_tokens",
            "created_at",
            "completed_at",
        ]
        read_only_fields = fields

    def get_error(self, turn: Turn) -> str:
        # Turn.error holds the exception's text (model endpoints, upstream messages): never shown to users.
        return turn.assistant_message if turn.status == Turn.Status.FAILED else ""


class TurnCompositionSerializer(serializers.ModelSerializer[Turn]):
    session = serializers.UUIDField(source="session_id", read_only=True)

    class Meta:
        model = Turn
        fields = ["id", "session", "seq", "status", "prompt_tokens", "composition", "retrieval"]
        read_only_fields = fields


class MessageField(serializers.CharField):
    """The chat message as sent: a JSON string, not trimmed, its NUL bytes and lone surrogates left for the
    runtime to refuse with its own codes (``nul_bytes``, ``invalid_characters``), as the web chat does.
    A number is refused, not taken as its digits."""

    default_error_messages = {"invalid": "Send the message as a string."}

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        kwargs.setdefault("allow_blank", True)
        super().__init__(**kwargs)
        self.validators = [
            v
            for v in self.validators
            if not isinstance(v, ProhibitNullCharactersValidator | ProhibitSurrogateCharactersValidator)
        ]

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class MessageInputSerializer(serializers.Serializer[Any]):
    message = MessageField(help_text="The user's message. Send an Idempotency-Key header to make retries safe.")


class MessageOutputSerializer(serializers.Serializer[Any]):
    turn = TurnOutputSerializer()
    reply = serializers.CharField()
    reply_html = serializers.CharField(help_text="The reply as sanitized HTML (markdown rendered).")
    replayed = serializers.BooleanField(help_text="True when an earlier request with this Idempotency-Key answered.")
    truncated = serializers.BooleanField(
        help_text="True when the reply was still cut off by the token limit after its continuations: it is kept as "
        "far as it got; send a message asking to continue."
    )
    is_demo = serializers.BooleanField()
    model_label = serializers.CharField()
    session = SessionOutputSerializer()
