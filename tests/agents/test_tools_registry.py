"""The tool registry: validation, deadlines, retries, TOOL_ERROR strings, records — and it never raises."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any, Literal

import pytest
from django.core.exceptions import ImproperlyConfigured
from pydantic import BaseModel, Field, field_validator

from agents.models import Agent, ToolInvocation
from agents.tools import (
    TOOL_ERROR_POLICY,
    Tool,
    ToolContext,
    ToolHttpError,
    ToolRegistry,
    parameters_schema,
    run_tool_call,
    tool_names,
    tool_specs,
)
from agents.tools.faults import ALWAYS, faults, inject_fault, parse_faults
from examples.booking.tools import timetable
from llm.base import ToolCallRequest
from sessions.models import ChatSession
from tests.world import make_agent

pytestmark = pytest.mark.django_db

TRAVEL_DAY = (date.today() + timedelta(days=30)).isoformat()


@pytest.fixture(autouse=True)
def fast_retries(settings: Any) -> Iterator[None]:
    # Real backoff, tiny delays: the retry path runs, the suite stays fast.
    settings.TOOLS_RETRY_BASE_DELAY = 0.01
    settings.TOOLS_RETRY_MAX_DELAY = 0.05
    settings.TOOLS_MAX_ATTEMPTS = 3
    settings.TOOLS_FAULTS = ""
    yield
    faults.clear()


@pytest.fixture
def agent() -> Agent:
    return make_agent(
        name="Booker", slug="booker", system_prompt="Book flights.", tools=["search_flights", "book_flight"]
    )


@pytest.fixture
def context(alice: Any, agent: Agent) -> ToolContext:
    session = ChatSession.objects.create(user=alice, agent=agent, workflow="flight_booking", state="IDLE")
    return ToolContext(user=alice, session=session, agent=agent)


def call(name: str, arguments: dict[str, Any] | str, call_id: str = "call-1") -> ToolCallRequest:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCallRequest(id=call_id, name=name, arguments=raw)


def search_args() -> dict[str, Any]:
    return {"origin": "Paris", "destination": "Rome", "date": TRAVEL_DAY}


class Counting:
    """A tool body that counts its runs and then does what it is told."""

    def __init__(self, behaviour: Any = None) -> None:
        self.runs = 0
        self.behaviour = behaviour

    def __call__(self, args: Any, context: ToolContext) -> object:
        self.runs += 1
        if self.behaviour is not None:
            return self.behaviour(args, context)
        return f"echo {args.text}"


class EchoArgs(BaseModel):
    text: str = Field(min_length=1, max_length=20)


def registry_with(
    run: Any, *, name: str = "echo", timeout_s: float | None = None, max_attempts: int | None = None
) -> ToolRegistry:
    return ToolRegistry(
        [
            Tool(
                name=name,
                description="test tool",
                args_model=EchoArgs,
                run=run,
                timeout_s=timeout_s,
                max_attempts=max_attempts,
            )
        ]
    )


# --- retries ----------------------------------------------------------------------------------


def test_503_then_success_is_retried_and_recorded(context: ToolContext) -> None:
    with inject_fault("search_flights", "http_503", times=1) as fault:
        result = run_tool_call(call=call("search_flights", search_args()), context=context)

    assert result.ok, result.content
    assert result.attempts == 2
    assert fault.fired == 1
    expected = timetable(origin="Paris", destination="Rome", on=date.fromisoformat(TRAVEL_DAY))
    assert all(flight.number in result.content for flight in expected)
    row = ToolInvocation.objects.get(session=context.session)
    assert (row.name, row.ok, row.attempts, row.error_kind) == ("search_flights", True, 2, "")
    assert row.arguments == search_args()
    assert row.result == result.content


def test_400_is_not_retried_and_the_model_sees_why(context: ToolContext) -> None:
    with inject_fault("search_flights", "http_400", times=2) as fault:
        result = run_tool_call(call=call("search_flights", search_args(), call_id="c-400"), context=context)
        assert fault.remaining == 1  # the second injected 400 was never reached: no retry

    assert not result.ok
    assert result.attempts == 1
    assert result.error_kind == "http_4xx"
    assert result.content.startswith("TOOL_ERROR: ")
    assert "HTTP 400" in result.content
    assert "Not retried" in result.content
    # What goes back to the model is exactly that string, answering the model's call id.
    assert result.as_message() == {"role": "tool", "tool_call_id": "c-400", "content": result.content}
    row = ToolInvocation.objects.get(session=context.session)
    assert (row.ok, row.error_kind, row.attempts) == (False, "http_4xx", 1)


def test_persistent_5xx_gives_up_after_the_configured_attempts(context: ToolContext, settings: Any) -> None:
    settings.TOOLS_MAX_ATTEMPTS = 4
    with inject_fault("search_flights", "http_503", times=ALWAYS) as fault:
        result = run_tool_call(call=call("search_flights", search_args()), context=context)

    assert not result.ok
    assert result.error_kind == "http_5xx"
    assert result.attempts == 4 == fault.fired
    assert "HTTP 503" in result.content and "tried 4 times" in result.content


def test_connection_error_is_retried(context: ToolContext) -> None:
    with inject_fault("search_flights", "connection_error", times=1):
        result = run_tool_call(call=call("search_flights", search_args()), context=context)
    assert result.ok
    assert result.attempts == 2


def test_4xx_raised_by_a_tool_body_is_not_retried(context: ToolContext) -> None:
    def reject(args: Any, context: ToolContext) -> str:
        raise ToolHttpError(404, "no such thing")

    body = Counting(reject)
    result = run_tool_call(
        call=call("echo", {"text": "hi"}), context=context, enabled=["echo"], registry=registry_with(body)
    )
    assert body.runs == 1
    assert result.error_kind == "http_4xx" and "HTTP 404" in result.content


# --- timeouts -----------------------------------------------------------------------------------


def test_a_hung_tool_times_out_with_its_deadline(context: ToolContext) -> None:
    release = threading.Event()

    def hang(args: Any, context: ToolContext) -> str:
        release.wait(10)
        return "too late"

    body = Counting(hang)
    try:
        result = run_tool_call(
            call=call("echo", {"text": "hi"}),
            context=context,
            enabled=["echo"],
            registry=registry_with(body, timeout_s=0.2, max_attempts=2),
        )
    finally:
        release.set()

    assert not result.ok
    assert result.error_kind == "timeout"
    assert result.content.startswith("TOOL_ERROR: echo timed out after 0.2 s")
    assert result.attempts == 2 == body.runs  # a timeout is retryable


def test_injected_timeout_then_success(context: ToolContext, settings: Any) -> None:
    settings.TOOLS_DEFAULT_TIMEOUT = 0.2
    with inject_fault("search_flights", "timeout", times=1):
        result = run_tool_call(call=call("search_flights", search_args()), context=context)
    assert result.ok, result.content
    assert result.attempts == 2


# --- broken payloads and bugs ------------------------------------------------------------------


def test_malformed_upstream_payload_becomes_tool_error(context: ToolContext) -> None:
    with inject_fault("search_flights", "malformed_payload", times=1):
        result = run_tool_call(call=call("search_flights", search_args()), context=context)
    assert not result.ok
    assert result.error_kind == "malformed_payload"
    assert result.attempts == 1  # retrying cannot fix a payload's shape
    assert "malformed response" in result.content and "'data'" in result.content


def test_keyerror_inside_a_tool_body_is_a_malformed_payload(context: ToolContext) -> None:
    def parse(args: Any, context: ToolContext) -> str:
        upstream: dict[str, Any] = {"flight": {"number": "QK1"}}
        return str(upstream["flight"]["price"])

    result = run_tool_call(
        call=call("echo", {"text": "x"}), context=context, enabled=["echo"], registry=registry_with(parse)
    )
    assert result.error_kind == "malformed_payload"
    assert "missing field 'price'" in result.content


def test_a_bug_inside_a_tool_never_raises(context: ToolContext) -> None:
    result = run_tool_call(
        call=call("echo", {"text": "x"}),
        context=context,
        enabled=["echo"],
        registry=registry_with(lambda args, ctx: 1 / 0),
    )
    assert not result.ok
    assert result.error_kind == "error"
    assert result.content.startswith("TOOL_ERROR: echo failed unexpectedly (ZeroDivisionError")


def test_a_bug_in_an_argument_schema_never_raises(context: ToolContext) -> None:
    class BrokenArgs(BaseModel):
        text: str

        @field_validator("text")
        @classmethod
        def _explode(cls, value: str) -> str:
            raise RuntimeError("validator bug")

    registry = ToolRegistry([Tool(name="broken", description="", args_model=BrokenArgs, run=lambda a, c: "never")])
    result = run_tool_call(call=call("broken", {"text": "x"}), context=context, enabled=["broken"], registry=registry)
    assert not result.ok
    assert result.error_kind == "error"
    assert "RuntimeError" in result.content and result.content.startswith("TOOL_ERROR:")


def test_non_string_output_is_serialised(context: ToolContext) -> None:
    registry = registry_with(lambda args, ctx: {"answer": args.text})
    result = run_tool_call(call=call("echo", {"text": "hi"}), context=context, enabled=["echo"], registry=registry)
    assert result.ok
    assert json.loads(result.content) == {"answer": "hi"}


# --- invalid arguments ------------------------------------------------------------------------


def book_args(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"origin": "Paris", "destination": "Rome", "depart_date": TRAVEL_DAY, "passengers": 2}
    args.update(overrides)
    return {k: v for k, v in args.items() if v is not None}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (book_args(passengers=12), "passengers: Input should be less than or equal to 9 (got 12)"),
        (book_args(passengers=0), "passengers: Input should be greater than or equal to 1"),
        ({"origin": "Paris", "destination": "Rome", "passengers": 1}, "depart_date: Field required"),
        (book_args(depart_date="2027-02-30"), "is not a real calendar date"),
        (book_args(depart_date="next friday"), "must be a date string YYYY-MM-DD"),
        (book_args(origin="P"), "origin: String should have at least 2 characters"),
        (book_args(destination="paris"), "origin and destination must be different cities"),
        (book_args(return_date="2000-01-01"), "return_date must not be before depart_date"),
        (book_args(seat="12A"), "seat: unexpected field"),
        ('{"origin": "Paris", ', "not valid JSON"),
        ('["Paris", "Rome"]', "expected a JSON object, got list"),
    ],
)
def test_invalid_arguments_come_back_as_tool_error(context: ToolContext, arguments: Any, expected: str) -> None:
    with inject_fault("book_flight", "http_503", times=1) as fault:
        result = run_tool_call(call=call("book_flight", arguments), context=context)
        assert fault.fired == 0  # the tool never ran

    assert not result.ok
    assert result.error_kind == "invalid_arguments"
    assert result.attempts == 0
    assert result.content.startswith("TOOL_ERROR: invalid arguments for book_flight: ")
    assert expected in result.content
    assert ToolInvocation.objects.get(session=context.session).error_kind == "invalid_arguments"


def test_empty_arguments_mean_an_empty_object(context: ToolContext) -> None:
    result = run_tool_call(call=call("search_memory", ""), context=context, enabled=["search_memory"])
    assert result.error_kind == "invalid_arguments"
    assert "query: Field required" in result.content


# --- unknown and disabled tools ----------------------------------------------------------------


def test_unknown_tool(context: ToolContext) -> None:
    result = run_tool_call(call=call("teleport", {}), context=context)
    assert not result.ok
    assert result.error_kind == "unknown_tool"
    assert (
        result.content == "TOOL_ERROR: there is no tool named 'teleport'. Available tools: search_flights, book_flight."
    )
    assert ToolInvocation.objects.filter(session=context.session, name="teleport", ok=False).count() == 1


def test_a_tool_the_agent_has_not_enabled(context: ToolContext) -> None:
    # The agent enables search_flights and book_flight only; http_get exists but is not theirs.
    result = run_tool_call(call=call("http_get", {"url": "http://127.0.0.1/"}), context=context)
    assert result.error_kind == "not_enabled"
    assert "not enabled" in result.content and result.content.startswith("TOOL_ERROR:")

    # An explicit list wins over the agent's.
    result = run_tool_call(call=call("book_flight", book_args()), context=context, enabled=["search_flights"])
    assert result.error_kind == "not_enabled"


# --- recording ----------------------------------------------------------------------------------


def test_no_session_no_record_and_a_failed_record_does_not_raise(alice: Any, agent: Agent) -> None:
    result = run_tool_call(call=call("search_flights", search_args()), context=ToolContext(user=alice, agent=agent))
    assert result.ok
    assert ToolInvocation.objects.count() == 0

    # A session that was never saved: the insert fails, the tool result still comes back.
    unsaved = ChatSession(id=None, user=alice, agent=agent, workflow="free_chat", state="CHATTING")
    result = run_tool_call(call=call("search_flights", search_args()), context=ToolContext(user=alice, session=unsaved))
    assert result.ok
    assert ToolInvocation.objects.count() == 0


# --- schemas ----------------------------------------------------------------------------------


def test_tool_specs_are_clean_json_schemas() -> None:
    specs = {spec.name: spec for spec in tool_specs(["book_flight", "search_memory", "no_such_tool"])}
    assert set(specs) == {"book_flight", "search_memory"}
    book = specs["book_flight"].parameters
    assert book["type"] == "object" and book["additionalProperties"] is False
    assert sorted(book["required"]) == ["depart_date", "destination", "origin", "passengers"]
    assert book["properties"]["passengers"]["minimum"] == 1 and book["properties"]["passengers"]["maximum"] == 9
    assert book["properties"]["return_date"]["type"] == "string"  # Optional[...] = None is just "not required"
    assert book["properties"]["origin"]["maxLength"] == 80
    memory = specs["search_memory"].parameters
    assert memory["properties"]["limit"] == {
        "default": 5,
        "description": memory["properties"]["limit"]["description"],
        "maximum": 20,
        "minimum": 1,
        "type": "integer",
    }
    assert '"title"' not in json.dumps([book, memory])  # pydantic's titles only cost tokens
    assert set(tool_names()) >= {"search_memory", "search_flights", "book_flight", "http_get"}


def test_parameters_schema_inlines_refs_and_keeps_literals() -> None:
    class Leg(BaseModel):
        city: str = Field(min_length=2)

    class Args(BaseModel):
        cabin: Literal["economy", "business"] = "economy"
        title: str = Field(description="a field that happens to be called title")
        legs: list[Leg] = Field(max_length=3)

    schema = parameters_schema(Args)
    dumped = json.dumps(schema)
    assert "$ref" not in dumped and "$defs" not in dumped
    assert schema["properties"]["cabin"]["enum"] == ["economy", "business"]
    assert "title" in schema["properties"]  # a field named title survives; schema titles do not
    assert "title" not in schema["properties"]["title"]
    assert schema["properties"]["legs"]["items"]["properties"]["city"]["minLength"] == 2
    assert schema["required"] == ["title", "legs"]


def test_http_get_schema_shows_the_current_size_limit(settings: Any) -> None:
    settings.TOOLS_HTTP_MAX_BYTES = 4096
    [spec] = tool_specs(["http_get"])
    assert spec.parameters["properties"]["max_bytes"]["maximum"] == 4096


def test_the_policy_tells_the_model_what_tool_error_means() -> None:
    assert TOOL_ERROR_POLICY.startswith(
        "When a tool returns a message beginning with TOOL_ERROR:, do not treat it as a result"
    )
    assert "after three failed attempts on the same subtask, report the failure clearly to the user and stop" in (
        TOOL_ERROR_POLICY.lower()
    )


# --- faults from settings (how a benchmark in another process injects them) ---------------------


def test_faults_from_the_setting(context: ToolContext, settings: Any) -> None:
    settings.TOOLS_FAULTS = "search_flights:http_503:1, book_flight:http_400"
    first = run_tool_call(call=call("search_flights", search_args()), context=context)
    second = run_tool_call(call=call("search_flights", search_args()), context=context)
    assert (first.ok, first.attempts) == (True, 2)
    assert (second.ok, second.attempts) == (True, 1)  # the count was used up
    booked = run_tool_call(call=call("book_flight", book_args()), context=context)
    assert booked.error_kind == "http_4xx"


def test_bad_fault_settings_fail_loudly() -> None:
    assert parse_faults("a:timeout:*, b:http_503") == [("a", "timeout", ALWAYS), ("b", "http_503", 1)]
    for bad in ("search_flights", "x:explode", "x:timeout:0", "x:timeout:two"):
        with pytest.raises(ImproperlyConfigured, match="TOOLS_FAULTS"):
            parse_faults(bad)


def test_a_result_with_nul_bytes_is_recorded_storable(context: ToolContext) -> None:
    """A fetched page may hold NUL bytes: the model gets U+FFFD in their place and the invocation's record is
    written (it was lost: PostgreSQL refuses NUL in text)."""
    registry = registry_with(Counting(lambda args, ctx: "page\x00with\x00nul"))

    result = run_tool_call(call=call("echo", {"text": "hi"}), context=context, enabled=["echo"], registry=registry)

    assert result.ok and result.content == "page\ufffdwith\ufffdnul"
    assert ToolInvocation.objects.get(session=context.session).result == result.content


def test_arguments_with_json_nul_escapes_are_recorded(context: ToolContext) -> None:
    """A model sends {"text": "a\\u0000b"}: parsed, that is a NUL, which the invocation's jsonb refused."""
    registry = registry_with(Counting())

    result = run_tool_call(
        call=call("echo", '{"text": "a\\u0000b"}'), context=context, enabled=["echo"], registry=registry
    )

    assert result.ok and result.content == "echo a\ufffdb"
    assert ToolInvocation.objects.get(session=context.session).arguments == {"text": "a\ufffdb"}
