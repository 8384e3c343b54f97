"""The offline demo model: deterministic, no network, and always labelled "demo model, not an LLM".

It lets the whole machinery (context, memory, state, tools) run and be seen on a fresh machine
with no model configured. It does not reason: replies are extractive (quoted from what it was
given), summaries keep the sentences that carry facts, and structured requests get a valid
instance. Other parts of the app teach it their domain through a small registry:

- ``register_structured_handler(schema, fn)``: ``fn(messages)`` returns an instance of ``schema``
  (or ``None`` to decline); used for that schema and its subclasses.
- ``register_reply_handler(fn)``: ``fn(messages, tools)`` returns a ``DemoReply`` (or ``None``);
  handlers are tried in registration order and the first answer wins; ``fallback=True`` ones (the generic
  workflow reply) after all the others.

A structured handler that serves many schemas reads the one asked for with ``requested_schema()``. The default
reply quotes what it was given, never the machine lines of a prompt (``WORKFLOW: …``, ``COLLECTED: …``).
"""

from __future__ import annotations

import contextvars
import datetime as dt
import enum
import json
import logging
import re
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from llm.base import HANDOFF_TOOL, Message, ToolCallRequest, ToolSpec
from llm.continuation import continued_partial
from llm.provider_base import BaseProvider, OpenedStream, RawCompletion, StreamChunk, ToolCallDelta
from llm.tokens import counter_for

logger = logging.getLogger(__name__)

DEMO_LABEL = "demo model, not an LLM"
DEMO_MODEL_NAME = "demo"
# The first words of every default reply, so nobody mistakes it for a model's answer.
DEMO_REPLY_PREFIX = f"[{DEMO_LABEL}]"


@dataclass
class DemoReply:
    text: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)


StructuredHandler = Callable[[list[Message]], BaseModel | None]
ReplyHandler = Callable[[list[Message], list[ToolSpec] | None], DemoReply | None]

_lock = threading.Lock()
_structured_handlers: dict[type[BaseModel], StructuredHandler] = {}
_reply_handlers: list[ReplyHandler] = []
_fallback_reply_handlers: list[ReplyHandler] = []
# The schema of the structured request being answered, for handlers registered for a base class of many.
_requested_schema: contextvars.ContextVar[type[BaseModel] | None] = contextvars.ContextVar(
    "demo_requested_schema", default=None
)


def requested_schema() -> type[BaseModel] | None:
    """The schema a structured handler is answering now (None outside one)."""
    return _requested_schema.get()


def register_structured_handler(schema: type[BaseModel], handler: StructuredHandler) -> None:
    """Answer structured requests for ``schema`` (and its subclasses) with ``handler``; replaces an earlier one."""
    with _lock:
        _structured_handlers[schema] = handler


def register_reply_handler(handler: ReplyHandler, *, fallback: bool = False) -> None:
    """Add a reply handler after the ones already registered; registering the same one twice is a no-op.
    ``fallback``: tried only after every other handler declined (a generic handler that a specific one, such
    as a workflow's own script, overrides whatever the order the apps register them in)."""
    with _lock:
        handlers = _fallback_reply_handlers if fallback else _reply_handlers
        if handler not in handlers:
            handlers.append(handler)


def unregister_structured_handler(schema: type[BaseModel]) -> None:
    with _lock:
        _structured_handlers.pop(schema, None)


def unregister_reply_handler(handler: ReplyHandler) -> None:
    with _lock:
        for handlers in (_reply_handlers, _fallback_reply_handlers):
            if handler in handlers:
                handlers.remove(handler)


class DemoModel(BaseProvider):
    """The offline stand-in for a model (see the module docstring)."""

    name = "demo"
    is_demo = True

    def __init__(self) -> None:
        super().__init__(model=DEMO_MODEL_NAME)

    def decides_in_reply(self) -> bool:
        return True  # its replies call the tools they are offered (the hand-off, a workflow's action)

    def _request(
        self,
        messages: list[Message],
        *,
        temperature: float | None,
        max_tokens: int | None,
        tools: list[ToolSpec] | None,
        schema: type[BaseModel] | None,
        purpose: str,
    ) -> RawCompletion:
        if schema is not None:
            instance = structured_instance(schema, messages)
            return RawCompletion(text=instance.model_dump_json(), finish_reason="stop", model=self.model)
        if purpose == "summarize":
            texts = [_text_of(m) for m in messages if m.get("role") != "system"]
            summary = extractive_summary(texts, max_tokens=max_tokens or 256)
            return RawCompletion(text=summary, finish_reason="stop", model=self.model)
        partial = continued_partial(messages)
        if partial is not None:
            # Asked to go on after a cut-off reply: the rest of the reply it would have given (a real model
            # continues its own words; the demo's are deterministic, so the rest is known).
            whole = self._request(
                messages[:-2], temperature=temperature, max_tokens=None, tools=tools, schema=None, purpose=purpose
            ).text
            rest = whole[len(partial) :] if whole.startswith(partial) else ""
            reply = DemoReply(text=rest)
        else:
            reply = demo_reply(messages, tools)
        text, finish = reply.text, "tool_calls" if reply.tool_calls else "stop"
        # The demo honours the token limit like a model would, so truncation handling is exercised too.
        if max_tokens is not None and counter_for(self.model).count(text) > max_tokens:
            # Cut where a model's stream would: on a whole character (a token can hold half of one).
            text, finish = counter_for(self.model).truncate(text, max_tokens).rstrip("\ufffd"), "length"
        return RawCompletion(text=text, finish_reason=finish, model=self.model, tool_calls=reply.tool_calls)

    def _open_stream(
        self,
        messages: list[Message],
        *,
        temperature: float | None,
        max_tokens: int | None,
        tools: list[ToolSpec] | None,
        purpose: str,
    ) -> OpenedStream:
        raw = self._request(
            messages, temperature=temperature, max_tokens=max_tokens, tools=tools, schema=None, purpose=purpose
        )
        return OpenedStream(chunks=word_chunks(raw))


def word_chunks(raw: RawCompletion) -> Iterator[StreamChunk]:
    """A completion as a model streams it: word-sized deltas (each word with the whitespace after it), then the
    tool calls, then the finish reason."""
    for word in re.findall(r"\s*\S+\s*", raw.text):
        yield StreamChunk(text=word)
    for index, call in enumerate(raw.tool_calls):
        yield StreamChunk(tool_call_deltas=[ToolCallDelta(index=index, id=call.id, name=call.name)])
        yield StreamChunk(tool_call_deltas=[ToolCallDelta(index=index, arguments=call.arguments)])
    yield StreamChunk(finish_reason=raw.finish_reason, model=raw.model)


# --- replies ------------------------------------------------------------------------------------------
def demo_reply(messages: list[Message], tools: list[ToolSpec] | None) -> DemoReply:
    """The registered handlers' answer, else the default extractive reply."""
    if tools and any(t.name == HANDOFF_TOOL.name for t in tools):
        user = next((_text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")
        if asks_for_person(user) and not any(m.get("role") == "tool" for m in messages):
            arguments = json.dumps({"reason": "the user asked for a person"})
            return DemoReply(
                text="", tool_calls=[ToolCallRequest(id="call_person", name=HANDOFF_TOOL.name, arguments=arguments)]
            )
    with _lock:
        handlers = (*_reply_handlers, *_fallback_reply_handlers)
    for handler in handlers:
        try:
            reply = handler(messages, tools)
        except Exception:
            # A broken handler must not take the demo down; the next handler or the default answers.
            logger.exception("demo reply handler %r failed", handler)
            continue
        if reply is not None:
            return reply
    return DemoReply(text=default_reply(messages))


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
# A prompt's machine-readable lines and headers: "WORKFLOW: returns (…)", "COLLECTED: {…}", "## Current workflow step",
# and the workflow section's instructions to the model ("Next question: …", "Already collected: …").
_MACHINE_LINE = re.compile(
    r"^(?:[A-Z][A-Z_]{2,}:|#+\s|(?:Next question|Already collected|Still needed|Current step|Slots):|"
    r"The user went back to change|NOT ACCEPTED)"
)
_STOPWORDS = frozenset(
    """a an the and or but if of to in on at for from by with about as is are was were be been being am do does
    did i me my you your we our it its this that these those what which who whom how when where why can could
    would should will shall may might must not no yes please thanks thank hi hello hey ok okay so just
    there here have has had want need like get""".split()
)


def default_reply(messages: list[Message]) -> str:
    """A deterministic reply that says what it is, then quotes the context most related to the user's words."""
    user_text = next((_text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")
    last = messages[-1] if messages else {}
    lines = [f"{DEMO_REPLY_PREFIX} I am the offline demo model: I quote what I was given instead of thinking."]
    if last.get("role") == "tool":
        lines.append(f"The tool answered: {_clip_words(_text_of(last), 60)}")
        return " ".join(lines)
    query = _keywords(user_text)
    context = [m for m in messages if m is not last and m.get("role") in ("system", "assistant", "tool", "user")]
    scored: list[tuple[int, int, str]] = []
    position = 0
    for message in context:
        text = _text_of(message)
        if message.get("role") == "system":
            text = _without_workflow_section(text)
        for sentence in split_sentences(text):
            if _MACHINE_LINE.match(sentence):
                continue  # the prompt's own lines (a workflow's state, its data): not for the user to read
            position += 1
            overlap = len(query & _keywords(sentence))
            if overlap:
                scored.append((overlap, -position, sentence))
    best = sorted(scored, reverse=True)[:2]
    if user_text:
        lines.append(f"You said: \u201c{_clip_words(user_text, 40)}\u201d.")
    if best:
        # Quote in their original order so the reply reads naturally.
        quoted = [s for _, _, s in sorted(best, key=lambda item: -item[1])]
        lines.append("Related to that, I was told: " + " ".join(_clip_words(s, 40) for s in quoted))
    else:
        lines.append("I found nothing related in what I was given.")
    lines.append("Set LLM_BASE_URL and LLM_MODEL to talk to a real model.")
    return " ".join(lines)


# The header of the prompt's workflow section (``llm.prompt.HEADER_WORKFLOW``; that module imports this one).
_WORKFLOW_HEADER = "## Current workflow step"


def _without_workflow_section(text: str) -> str:
    """A system prompt without its workflow section: instructions to the model, never quoted to the user."""
    kept: list[str] = []
    skipping = False
    for line in text.splitlines():
        if line.startswith("## "):
            skipping = line.strip() == _WORKFLOW_HEADER
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


# --- summaries ----------------------------------------------------------------------------------------
_MONTHS_DAYS = re.compile(
    r"\b(jan(uary)?|feb(ruary)?|mar(ch)?|apr(il)?|may|june?|july?|aug(ust)?|sep(t(ember)?)?|oct(ober)?|"
    r"nov(ember)?|dec(ember)?|monday|tuesday|wednesday|thursday|friday|saturday|sunday|today|tomorrow|"
    r"tonight|next week|yesterday)\b",
    re.IGNORECASE,
)
_DECISIONS = re.compile(
    r"\b(decided|decide|agreed|agree|confirm(ed)?|booked|book|chose|choose|chosen|prefer(s|red)?|will|must|"
    r"plan(s|ned)?|want(s|ed)?|need(s|ed)?|selected|cancel(led)?|changed?|set|allergic|always|never|my name|"
    r"live[sd]?)\b",
    re.IGNORECASE,
)
_FILLER = re.compile(
    r"^\W*(hi|hello|hey|thanks|thank you|ok(ay)?|sure|great|cool|got it|sounds good|no problem|you're welcome|"
    r"bye|goodbye|yes|no|alright|fine)\W*$",
    re.IGNORECASE,
)
_SPEAKER = re.compile(r"^(user|assistant|system|tool)\s*:\s*", re.IGNORECASE)
_FIRST_PERSON = re.compile(r"\b(I|I'm|I am|I've|my|me|we|we're|our)\b")
_NORMALISE = re.compile(r"[\d\W_]+")
# The demo's own echoes of tool output and memories: not facts of the conversation.
_ECHO = re.compile(r"^\W*(\[demo model[^\]]*\]\s*)?(the tool answered|related to that, i was told)", re.IGNORECASE)


def split_sentences(text: str) -> list[str]:
    """Sentences and lines of ``text``, stripped; empty pieces dropped."""
    pieces: list[str] = []
    for line in text.splitlines():
        pieces.extend(p.strip() for p in re.split(r"(?<=[.!?])\s+", line))
    return [p for p in pieces if p]


def _sentence_score(sentence: str, speaker: str = "") -> int:
    body = _SPEAKER.sub("", sentence)
    if _FILLER.match(body) or len(_WORD.findall(body)) < 3:
        return 0
    if speaker == "assistant" and (body.rstrip().endswith(("?", "?)")) or _ECHO.match(body)):
        # The assistant's questions are re-asked from the workflow step each turn; they are not facts.
        return 0
    score = 0
    if speaker == "user":
        # What users say ("I'm allergic to peanuts", "my number is QX-4471") is what a summary must keep;
        # the assistant mostly repeats or quotes it.
        score += 3
    if _FIRST_PERSON.search(body):
        score += 2
    if re.search(r"\d", body):
        score += 3
    if _MONTHS_DAYS.search(body):
        score += 2
    if _DECISIONS.search(body):
        score += 2
    # Names: capitalised words that do not start the sentence.
    words = body.split()
    if any(w[:1].isupper() and w.strip(".,!?;:").isalpha() and w.lower() not in _STOPWORDS for w in words[1:]):
        score += 1
    return score


def _consider(sentence: str, speaker: str, seen: set[str], candidates: list[tuple[int, int, str]]) -> None:
    # Near-duplicates (the same sentence with other numbers) are kept once.
    key = _NORMALISE.sub(" ", _SPEAKER.sub("", sentence).lower()).strip()
    if key in seen:
        return
    seen.add(key)
    score = _sentence_score(sentence, speaker)
    if score:
        candidates.append((len(candidates), score, sentence))


def extractive_summary(texts: list[str], *, max_tokens: int) -> str:
    """The sentences of ``texts`` that carry facts (numbers, dates, names, decisions), in order, within ``max_tokens``.

    Filler (greetings, thanks, one-word answers) is dropped. When over budget the weakest
    sentences go first; the result never exceeds ``max_tokens`` tokens.
    """
    counter = counter_for(DEMO_MODEL_NAME)
    seen: set[str] = set()
    candidates: list[tuple[int, int, str]] = []  # (position, score, sentence)
    for text in texts:
        speaker = ""
        for line in text.splitlines():
            found = _SPEAKER.match(line.strip())
            if found:
                speaker = found.group(1).lower()
            for sentence in split_sentences(line):
                # A summary carried over puts several speakers on one line: each prefix switches.
                prefixed = _SPEAKER.match(sentence)
                if prefixed:
                    speaker = prefixed.group(1).lower()
                _consider(sentence, speaker, seen, candidates)
    if not candidates:
        return ""
    kept = list(candidates)
    while len(kept) > 1 and counter.count(" ".join(s for _, _, s in kept)) > max_tokens:
        # Drop the weakest; among equals the oldest, since later sentences tend to supersede earlier ones.
        weakest = min(kept, key=lambda item: (item[1], item[0]))
        kept.remove(weakest)
    return counter.truncate(" ".join(s for _, _, s in kept), max_tokens)


# --- structured outputs -------------------------------------------------------------------------------
def structured_instance(schema: type[BaseModel], messages: list[Message]) -> BaseModel:
    """A registered handler's instance of ``schema`` (or of a base class it inherits), else a generic one."""
    with _lock:
        handlers = dict(_structured_handlers)
    for klass in schema.__mro__:
        handler = handlers.get(klass) if isinstance(klass, type) else None
        if handler is None:
            continue
        token = _requested_schema.set(schema)
        try:
            result = handler(messages)
        except Exception:
            logger.exception("demo structured handler for %s failed", klass.__name__)
            break
        finally:
            _requested_schema.reset(token)
        if result is None:
            break
        try:
            # Round-trip through JSON so the caller gets exactly what a model's JSON would give.
            return schema.model_validate_json(result.model_dump_json())
        except ValidationError:
            logger.exception("demo structured handler for %s returned an invalid object", klass.__name__)
            break
    return generic_instance(schema)


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


# --- helpers ------------------------------------------------------------------------------------------
def _text_of(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Content parts ({"type": "text", "text": ...}) as some clients send them.
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    if content is None:
        return ""
    return json.dumps(content)


# "I want to talk to a human", "can I speak with a person", "connect me to an agent", "real person please".
_PERSON = re.compile(
    r"\b(?:(?:talk|speak|chat)\s+(?:to|with)\s+(?:a\s+|an\s+|some\s*one\s+|someone\s+)?(?:real\s+|live\s+)?"
    r"(?:human|person|people|agent|operator|representative|someone)|(?:real|live)\s+(?:human|person|agent)|"
    r"(?:connect|transfer|put)\s+me\s+(?:to|through to|with)\s+(?:a\s+|an\s+)?(?:human|person|agent|operator))\b",
    re.IGNORECASE,
)


def asks_for_person(text: str) -> bool:
    """The demo model's reading of "does the user ask for a person?" (a model answers it in the structured
    decision or the routing; the demo is not one)."""
    return bool(_PERSON.search(text))


def _keywords(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if w.lower() not in _STOPWORDS and len(w) > 2}


def _clip_words(text: str, limit: int) -> str:
    words = text.split()
    return " ".join(words) if len(words) <= limit else " ".join(words[:limit]) + " …"
