"""``stream_structured``: a structured reply read while it is written, its decision first (once), then its reply's
text as deltas; a reply written before the decision is read whole first; an object that is not valid fails."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from llm.base import CallContext, StructuredOutputError
from llm.provider_base import Decided, streams_reply
from llm.scripted import ScriptedProvider, ScriptedReply

pytestmark = pytest.mark.django_db


class Answer(BaseModel):
    next_state: Literal["A", "B"]
    confidence: float = 1.0
    reply: str


def _read(text: str) -> tuple[list[Any], Any]:
    provider = ScriptedProvider([ScriptedReply(text=text)], streams_decisions=True)
    stream = provider.stream_structured([{"role": "user", "content": "hi"}], schema=Answer, ctx=CallContext())
    return list(stream), stream


def test_the_decision_comes_once_before_the_reply_text_which_streams_in_pieces() -> None:
    reply = 'Caf\u00e9 at 5, "quoted" and a\\backslash, then more words here'
    events, stream = _read(json.dumps({"next_state": "B", "confidence": 0.8, "reply": reply}))
    assert streams_reply(Answer)
    assert isinstance(events[0], Decided) and events[0].fields == {"next_state": "B", "confidence": 0.8}
    assert sum(isinstance(e, Decided) for e in events) == 1
    texts = [e for e in events if isinstance(e, str)]
    assert len(texts) > 3 and "".join(texts) == reply  # escapes decoded, nothing lost or doubled
    assert stream.instance == Answer(next_state="B", confidence=0.8, reply=reply)


def test_a_reply_written_before_the_decision_is_read_whole_first() -> None:
    events, _stream = _read(json.dumps({"reply": "all at once here", "next_state": "A"}))
    assert isinstance(events[0], Decided) and events[0].fields["next_state"] == "A"
    assert events[1:] == ["all at once here"]


def test_an_object_that_is_not_valid_raises_after_the_stream() -> None:
    with pytest.raises(StructuredOutputError):
        _read(json.dumps({"next_state": "C", "reply": "no such state"}))
    with pytest.raises(StructuredOutputError):
        _read("Sure! Here is my answer in prose.")
