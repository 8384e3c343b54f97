"""The memory budget is a ceiling, not a target (issue 56): a prompt gets the memories that earn their place.

- A turn of a task workflow (a booking) is scoped: the small talk of the user's free chats is not its memory,
  while the user's facts and the episodes of its own workflow are.
- A question that one memory answers gets that memory first and few beside it (before: the calibrated
  filter passed the first ten candidates whatever their relevance, and the budget took them all).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from agents.models import Agent
from agents.services import default_agents_ensure
from memory.retrieval import memories_for_prompt, tuning
from memory.schemas import RankedMemories
from memory.services import memory_create
from memory.services.turns import episode_text
from orchestrator.runtime import turn_run
from sessions.models import ChatSession, Turn
from sessions.services import session_create

pytestmark = pytest.mark.django_db

SMALL_TALK = [
    "Phone test, one two three",
    "Is this thing on? Testing the chat",
    "Haha, nice weather today",
    "Just testing, ignore me",
    "lol ok, what's up?",
    "Good morning! How are you?",
    "I had pizza for lunch",
    "My cat is sleeping on the keyboard again",
    "Thanks, that's all for now",
    "Hello? Testing again",
    "Nothing much, just bored at work",
    "Do you like music? I like jazz",
]


def _episodes(user: Any, session: ChatSession, lines: list[str], reply: str) -> set[int]:
    """The episodes of ``lines`` said in ``session``, as the memory-write task writes them."""
    ids = set()
    for seq, line in enumerate(lines, start=session.turns.count() + 1):
        turn = Turn.objects.create(
            session=session, seq=seq, user_message=line, assistant_message=reply, status=Turn.Status.COMPLETED
        )
        text = episode_text(user_message=line, assistant_message=reply)
        ids.add(memory_create(user=user, kind="episodic", text=text, source_session=session, source_turn=turn).id)
    return ids


@pytest.fixture
def booking_agent(db: Any) -> Agent:
    default_agents_ensure()
    return Agent.objects.get(slug="flight-booking")


def test_a_booking_turn_holds_no_small_talk_from_the_users_free_chats(
    alice: Any, chat_agent: Agent, booking_agent: Agent
) -> None:
    free = session_create(user=alice, agent=chat_agent)
    assert free.workflow == "free_chat"
    small_talk = _episodes(alice, free, SMALL_TALK, "Happy to chat! Anything I can help with?")
    home = memory_create(
        user=alice, kind="semantic", text="The user's home airport is London Heathrow.", fact_key="home_airport"
    )
    earlier = session_create(user=alice, agent=booking_agent)
    booked_before = _episodes(
        alice, earlier, ["I'd like to book a flight to Lisbon, window seat please"], "Booked: London to Lisbon."
    )
    # Small talk written last: the newest turns of the user (tier 1's recent actions) are all free chat.
    _episodes(alice, free, ["ok testing the phone one more time"], "Still here!")

    session = session_create(user=alice, agent=booking_agent)
    result = turn_run(session=session, message="Hi, I'd like to book a flight")

    assert result.turn.status == Turn.Status.COMPLETED, result.turn.error
    report = result.turn.retrieval
    kept = {item["id"] for item in report["items"]}
    assert home.id in kept  # the user's facts are in every scope
    assert booked_before <= kept  # and so is what was said in the same workflow
    small_talk_kept = {c["preview"] for c in report["candidates"] if c["kept"] and c["id"] in small_talk}
    assert not small_talk_kept, small_talk_kept
    assert not [c for c in report["candidates"] if c["kept"] and c["preview"].startswith("User: ok testing")]
    # The report says why small talk stayed out.
    reasons = [c["reason"] for c in report["candidates"] if c["id"] in small_talk and c["tier"] == 2]
    assert reasons and all("free_chat chat, outside this workflow" in r for r in reasons), reasons


def test_a_free_chat_turn_still_searches_every_chat_of_the_user(alice: Any, chat_agent: Agent) -> None:
    """Free chat has no scope: a booking's episode answers a question asked there."""
    booking = ChatSession.objects.create(user=alice, agent=chat_agent, workflow="flight_booking", state="COMPLETED")
    booked = _episodes(alice, booking, ["Book me a flight to Lisbon on May 3"], "Booked: London to Lisbon, May 3.")
    session = session_create(user=alice, agent=chat_agent)

    result = turn_run(session=session, message="When is my flight to Lisbon?")

    assert booked <= {item["id"] for item in result.turn.retrieval["items"]}


# One person's independent memories, each about something else; each question below is answered by one.
LIFE = [
    "My dentist is Dr. Okafor at the Headingley practice; check-ups every six months.",
    "I ran the Leeds half marathon in October in 1 hour 52 minutes.",
    "My sister Nia lives in Cardiff with her two boys.",
    "I am allergic to penicillin; it gave me a rash as a child.",
    "Our boiler was replaced in March by Hughes Heating; the warranty runs five years.",
    "I teach chemistry to year 10 and year 11 at Roundhay School.",
    "My car is a blue 2016 Skoda Octavia estate.",
    "I started learning the cello last winter with a teacher called Marek.",
    "We adopted a greyhound named Biscuit from a rescue in Wakefield.",
    "My passport expires in August next year.",
    "I prefer aisle seats on long flights because of my knee.",
    "Mum's birthday is on the 14th of June; she likes lilies.",
    "I switched my energy supplier to Octopus in January.",
    "My book club meets on the first Thursday of each month at the library.",
    "I grow tomatoes and runner beans on an allotment near Meanwood.",
    "My bank is Nationwide; I moved my current account there in 2021.",
    "I am vegetarian and have been since university.",
    "The kitchen tap has been dripping since Christmas.",
    "My best friend from school, Priya, moved to Toronto.",
    "I broke my left wrist skiing in Austria in 2019.",
    "We go camping in the Lake District every August bank holiday.",
    "My laptop is a ThinkPad the school gave me.",
    "I volunteer at the food bank on Saturday mornings.",
    "My grandfather was a coal miner in the Rhondda valley.",
]
QUESTIONS = {
    "Who is my dentist again?": 0,
    "Which medicine am I allergic to?": 3,
    "What did we name the dog we adopted?": 8,
}


@pytest.mark.real_embedder
@pytest.mark.parametrize("question", list(QUESTIONS))
def test_a_question_one_memory_answers_gets_that_memory_first_and_few_beside_it(alice: Any, question: str) -> None:
    memories = [memory_create(user=alice, kind="episodic", text=text) for text in LIFE]
    client = APIClient()
    client.force_authenticate(alice)

    response = client.get(reverse("api-memory-search"), {"q": question, "budget_tokens": "4000"})

    assert response.status_code == 200, response.content
    items = response.json()["items"]
    assert items and items[0]["memory"]["id"] == memories[QUESTIONS[question]].id, [i["memory"]["text"] for i in items]
    assert len(items) - 1 < 5, [i["memory"]["text"] for i in items]
    # The report says why each one is in.
    kept = [c for c in response.json()["report"]["candidates"] if c["kept"]]
    assert kept and all(c["reason"] for c in kept)


def test_the_reranker_fills_no_more_of_the_prompt_than_the_calibrated_filter(
    alice: Any, scripted: Any, settings: Any
) -> None:
    """Its picks first, then the calibrated filter's judgement of the rest: at most CALIBRATED_MAX_KEPT of tier 2
    however many look alike (before: up to MEMORY_MAX_KEPT, 25, and the budget)."""
    settings.MEMORY_RECENT_ACTIONS = 0
    for n in range(30):
        memory_create(user=alice, kind="episodic", text=f"User: sailing on the lake, trip number {n}")
    scripted.add(RankedMemories(order=[3, 1]))

    found = memories_for_prompt(user=alice, query="sailing on the lake", budget_tokens=4000, touch=False)

    assert found.filter_mode == "rerank"
    assert len(found.items) == tuning.CALIBRATED_MAX_KEPT
    past = [c for c in found.candidates if not c.kept and "past the" in c.reason]
    assert past and all(f"past the {tuning.CALIBRATED_MAX_KEPT} the rerank filter keeps" in c.reason for c in past)
