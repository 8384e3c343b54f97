"""The demo model hears a request for a person in the words people use (llm/demo/reading.py).

The phrasings were written from how people ask a chat for a human, never from the code's own patterns; a model
answers the same question in its decision, the demo model has to read it."""

from __future__ import annotations

import pytest

from llm.demo import asks_for_person

ASKS = [
    "I'd like a person please",
    "Can I talk to a human please?",
    "i want a human",
    "can I get a real person",
    "get me someone who can actually help",
    "Is there a human I can talk to?",
    "let me speak to someone",
    "I need to speak with a real person, not a bot",
    "human please",
    "Operator!",
    "a real person",
    "could I have a manager",
    "put me through to someone",
    "I want to talk to customer service",
    "connect me with an agent",
    "speak to a supervisor",
    "I would like to speak to a representative",
    "can i chat with a live agent",
    "Is there any real person there?",
    "I'd like to talk to somebody",
]
DOES_NOT = [
    "Who was the first person on the moon?",
    "I met a person at the airport yesterday",
    "Tell me about the human body",
    "My sister is a customer service manager",
    "What is my name?",
    "I want a window seat",
    "My travel agent booked the hotel",
    "I'd like a person of my own age to sit next to",
]


@pytest.mark.parametrize("said", ASKS)
def test_a_request_for_a_person_is_heard(said: str) -> None:
    assert asks_for_person(said)


@pytest.mark.parametrize("said", DOES_NOT)
def test_a_person_merely_mentioned_is_not_a_request(said: str) -> None:
    assert not asks_for_person(said)
