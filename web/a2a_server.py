"""A2A 1.0 on the web port (``config.asgi``), through the official ``a2a-sdk``: its JSON-RPC dispatcher (the
protocol, the ``A2A-Version`` check, its errors) in front of a request handler that runs turns with this app's
services. A context is a session, a task is a turn (its state from the turn's); the agents are the card's skills.

- ``GET /.well-known/agent-card.json``: the agent card (open to anyone, as A2A discovery is): the JSON-RPC
  interface at ``/a2a/``, bearer auth declared (the API token), each active agent a skill.
- ``POST /a2a/`` (the API token, ``Authorization: Bearer <key>``): ``SendMessage``, ``SendStreamingMessage``,
  ``GetTask``, ``ListTasks``, ``CancelTask``. A message names its agent in ``metadata.agent`` (a skill's id), or
  continues a context (``contextId``: one of the person's sessions). Another person's task or context is not found.

The contract: docs/openai-compatible.md ("A2A").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from types import SimpleNamespace
from typing import Any, TypeVar

from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    CancelTaskRequest,
    GetTaskRequest,
    HTTPAuthSecurityScheme,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StringList,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from django.conf import settings
from django.db.models import QuerySet
from google.protobuf.json_format import MessageToDict
from rest_framework.authtoken.models import Token
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agents.models import Agent
from agents.selectors import active_agent, active_agents
from core.db import release_connection
from core.errors import Refusal
from core.throttles import messages_rate_wait
from orchestrator.runtime import MessageRejected, turn_run, turn_stream, validate_message
from sessions.models import ChatSession, Turn
from sessions.selectors import own_session
from sessions.services import session_create

logger = logging.getLogger(__name__)

A2A_PATH = "/a2a/"
CARD_PATH = "/.well-known/agent-card.json"
REPLY_ARTIFACT = "reply"
STATES = {
    Turn.Status.PENDING: TaskState.TASK_STATE_SUBMITTED,
    Turn.Status.RUNNING: TaskState.TASK_STATE_WORKING,
    Turn.Status.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    Turn.Status.FAILED: TaskState.TASK_STATE_FAILED,
}
T = TypeVar("T")


async def _in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function`` on a thread of its own (database work, a turn), which gives its connection back when done."""

    def run() -> T:
        try:
            return function(*args, **kwargs)
        finally:
            release_connection()

    return await asyncio.to_thread(run)


# --- the card ------------------------------------------------------------------------------------------------
def agent_card(base_url: str) -> AgentCard:
    """The card: this app's agents as skills, the JSON-RPC interface, bearer auth (the API token)."""
    skills = [
        AgentSkill(id=agent.slug, name=agent.name, description=agent.description or agent.name, tags=["agent"])
        for agent in active_agents()
    ]
    return AgentCard(
        name="Agents",
        description="Agents with memory and durable workflows. Name one in the message's metadata.agent "
        "(a skill's id); a contextId continues a conversation.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=base_url.rstrip("/") + A2A_PATH, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        security_schemes={
            "bearer": SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer", description="Your API token (the admin, Auth Token)."
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList()})],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=skills,
    )


async def _card(request: Request) -> Response:
    card = await _in_thread(agent_card, str(request.base_url))
    return JSONResponse(agent_card_to_dict(card))


# --- tasks are turns -----------------------------------------------------------------------------------------
def _message(role: int, text: str, turn: Turn, suffix: str) -> Message:
    return Message(
        message_id=f"turn-{turn.pk}-{suffix}",
        context_id=str(turn.session_id),
        task_id=str(turn.pk),
        role=role,  # type: ignore[arg-type]
        parts=[Part(text=text)],
    )


def task_of(turn: Turn) -> Task:
    """A turn as an A2A task: its state, the person's message and the reply (history, status, the reply artifact)."""
    history = [_message(Role.ROLE_USER, turn.user_message, turn, "user")]
    status = TaskStatus(state=STATES.get(turn.status, TaskState.TASK_STATE_WORKING))  # type: ignore[call-overload]
    artifacts = []
    if turn.status in (Turn.Status.COMPLETED, Turn.Status.FAILED):
        reply = _message(Role.ROLE_AGENT, turn.assistant_message, turn, "agent")
        history.append(reply)
        status.message.CopyFrom(reply)
        if turn.status == Turn.Status.COMPLETED:
            artifacts.append(
                Artifact(artifact_id=REPLY_ARTIFACT, name="reply", parts=[Part(text=turn.assistant_message)])
            )
    return Task(id=str(turn.pk), context_id=str(turn.session_id), status=status, history=history, artifacts=artifacts)


def _own_turns(person: Any) -> QuerySet[Turn]:
    return Turn.objects.filter(session__user=person)


def _own_turn(person: Any, task_id: str) -> Turn:
    turn = _own_turns(person).filter(pk=int(task_id)).first() if task_id.isdigit() and len(task_id) < 19 else None
    if turn is None:
        raise TaskNotFoundError(message="No such task.")
    return turn


def _text_of(message: Message) -> str:
    if any(not part.HasField("text") for part in message.parts):
        raise InvalidParamsError(message="Only text parts are accepted.")
    try:
        # The rules of every door, before a session is made for it.
        return validate_message("\n".join(part.text for part in message.parts))
    except MessageRejected as exc:
        raise _refused(exc) from None


def _metadata(params: SendMessageRequest) -> dict[str, Any]:
    return {**MessageToDict(params.message.metadata), **MessageToDict(params.metadata)}


def _session_for(person: Any, params: SendMessageRequest) -> ChatSession:
    """The session the message continues (its ``contextId``, one of the person's), or a new one with the agent its
    metadata names."""
    named = str(_metadata(params).get("agent") or "")
    context_id = params.message.context_id
    if context_id:
        session = own_session(person, context_id)
        if session is None:
            raise InvalidParamsError(message="No such context.")
        if named and named != session.agent.slug:
            raise InvalidParamsError(message=f"This context talks with the agent {session.agent.slug!r}.")
        return session
    agent: Agent | None = active_agent(named) if named and "\x00" not in named else None
    if agent is None:
        raise InvalidParamsError(
            message="Name the agent in the message's metadata.agent: one of the agent card's skill ids."
        )
    return session_create(user=person, agent=agent)


def _rate_checked(person: Any) -> None:
    """The messages rate of every door (``API_THROTTLE_MESSAGES``, one counter per person)."""
    wait = messages_rate_wait(SimpleNamespace(user=person, META={}))
    if wait is not None:
        raise InvalidRequestError(message=f"Too many messages; try again in {wait} seconds.")


def _refused(exc: Refusal) -> InvalidParamsError:
    return InvalidParamsError(message=exc.message_for_people(), data={"code": exc.code})


class TurnsRequestHandler(RequestHandler):
    """A2A's operations over this app's turn services (``turn_run``, ``turn_stream``)."""

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        person = _person(context)
        text = _text_of(params.message)

        def send() -> Task:
            _rate_checked(person)
            session = _session_for(person, params)
            try:
                return task_of(turn_run(session=session, message=text).turn)
            except Refusal as exc:
                raise _refused(exc) from exc

        return await _in_thread(send)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any, None]:
        person = _person(context)
        text = _text_of(params.message)
        await _in_thread(_rate_checked, person)
        session = await _in_thread(_session_for, person, params)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def produce() -> None:
            # The turn runs (or is followed) on this thread, which holds its session's lock: never the event loop.
            try:
                events = turn_stream(session=session, message=text)
                try:
                    for event in events:
                        loop.call_soon_threadsafe(queue.put_nowait, ("event", event))
                finally:
                    close = getattr(events, "close", None)
                    if close is not None:
                        close()
            except Exception as exc:  # noqa: BLE001 - raised again in the event loop, where the dispatcher reports it
                loop.call_soon_threadsafe(queue.put_nowait, ("raise", exc))
            finally:
                release_connection()
                loop.call_soon_threadsafe(queue.put_nowait, ("end", None))

        worker = loop.run_in_executor(None, produce)
        context_id, task_id, streamed = str(session.pk), "", False
        try:
            while True:
                kind, item = await queue.get()
                if kind == "end":
                    break
                if kind == "raise":
                    raise _refused(item) if isinstance(item, Refusal) else item
                event = item
                if event["type"] == "turn" and not task_id:
                    task_id = str(event["turn_id"])
                    yield Task(
                        id=task_id,
                        context_id=context_id,
                        status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
                        history=[
                            Message(
                                message_id=f"turn-{task_id}-user",
                                context_id=context_id,
                                task_id=task_id,
                                role=Role.ROLE_USER,
                                parts=[Part(text=text)],
                            )
                        ],
                    )
                elif event["type"] == "delta" and task_id and event.get("text"):
                    yield TaskArtifactUpdateEvent(
                        task_id=task_id,
                        context_id=context_id,
                        artifact=Artifact(artifact_id=REPLY_ARTIFACT, name="reply", parts=[Part(text=event["text"])]),
                        append=streamed,
                    )
                    streamed = True
                elif event["type"] in ("done", "error") and task_id:
                    turn = await _in_thread(Turn.objects.get, pk=int(task_id))
                    task = task_of(turn)
                    yield TaskStatusUpdateEvent(task_id=task_id, context_id=context_id, status=task.status)
        finally:
            await worker

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        person = _person(context)
        return await _in_thread(lambda: task_of(_own_turn(person, params.id)))

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        person = _person(context)
        size = min(int(params.page_size or 50), 100)

        def listed() -> ListTasksResponse:
            turns = _own_turns(person).order_by("-pk")
            if params.context_id:
                session = own_session(person, params.context_id)
                turns = turns.filter(session=session) if session is not None else turns.none()
            tasks = [task_of(turn) for turn in turns[:size]]
            return ListTasksResponse(tasks=tasks, page_size=size, total_size=len(tasks))

        return await _in_thread(listed)

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        person = _person(context)
        turn = await _in_thread(_own_turn, person, params.id)
        # A turn is short and saved before its model call: once accepted it runs to its end (a crash resumes it), so
        # neither a finished nor a running one is cancelled.
        state = "finished" if turn.status in (Turn.Status.COMPLETED, Turn.Status.FAILED) else "being answered"
        raise TaskNotCancelableError(message=f"This task is {state}; a turn is not cancelled once accepted.")

    async def on_subscribe_to_task(self, params: Any, context: ServerCallContext) -> AsyncGenerator[Any, None]:
        raise UnsupportedOperationError(message="Read the task with GetTask.")
        yield

    async def on_create_task_push_notification_config(self, params: Any, context: ServerCallContext) -> Any:
        raise PushNotificationNotSupportedError()

    async def on_get_task_push_notification_config(self, params: Any, context: ServerCallContext) -> Any:
        raise PushNotificationNotSupportedError()

    async def on_list_task_push_notification_configs(self, params: Any, context: ServerCallContext) -> Any:
        raise PushNotificationNotSupportedError()

    async def on_delete_task_push_notification_config(self, params: Any, context: ServerCallContext) -> Any:
        raise PushNotificationNotSupportedError()

    async def on_get_extended_agent_card(self, params: Any, context: ServerCallContext) -> Any:
        raise UnsupportedOperationError(message="The agent card is public: /.well-known/agent-card.json.")


# --- who asks ------------------------------------------------------------------------------------------------
class _Person(User):
    def __init__(self, person: Any) -> None:
        self.person = person

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return str(self.person.get_username())


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The call's context with the person the API token named (resolved before the dispatcher runs)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["person"] = request.scope.get("a2a_person")
        return context

    def build_user(self, request: Request) -> User:
        return _Person(request.scope.get("a2a_person"))


def _person(context: ServerCallContext) -> Any:
    person = context.state.get("person")
    if person is None:  # the ASGI wrapper refuses such a request first
        raise InvalidParamsError(message="Not authenticated.")
    return person


def _person_for(header: str) -> Any:
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() not in ("bearer", "token") or not key.strip() or "\x00" in key:
        return None
    token = Token.objects.select_related("user").filter(key=key.strip(), user__is_active=True).first()
    return token.user if token is not None else None


def _refused_body(headers: dict[str, str]) -> Response | None:
    """413 for a body over ``MAX_REQUEST_BYTES`` and 411 for one without a length, before anything reads it (the
    SDK's dispatcher reads a body whole)."""
    length = headers.get("content-length", "")
    limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    if not length.isdigit():
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return JSONResponse({"error": {"code": "length_required", "message": "Send a Content-Length."}}, 411)
        return None
    if int(length) > limit:
        message = f"The request body is {length} bytes; the limit is {limit}."
        return JSONResponse({"error": {"code": "payload_too_large", "message": message}}, 413)
    return None


def http_app() -> Callable[..., Any]:
    """The ASGI app of ``/a2a/`` and the agent card: a request to ``/a2a/`` without a valid API token is a 401."""
    starlette = Starlette(
        routes=[
            *create_jsonrpc_routes(TurnsRequestHandler(), rpc_url=A2A_PATH, context_builder=_ContextBuilder()),
            Route(CARD_PATH, _card, methods=["GET"]),
        ]
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") != CARD_PATH:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            refused = _refused_body(headers)
            if refused is not None:
                await refused(scope, receive, send)
                return
            person = await _in_thread(_person_for, headers.get("authorization", ""))
            if person is None:
                response = JSONResponse(
                    {"error": {"code": "not_authenticated", "message": "Send Authorization: Bearer <your API token>."}},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
            scope = {**scope, "a2a_person": person}
        await starlette(scope, receive, send)

    return app
