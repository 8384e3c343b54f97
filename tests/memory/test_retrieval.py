from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents.models import Agent
from llm.base import LLMTimeout
from memory.models import Memory
from memory.retrieval import memories_for_prompt, memory_search, trigger_matches, tuning
from memory.retrieval.cheap import cheap_model_key
from memory.retrieval.relevance import rerank_pace
from memory.schemas import RankedMemories, RelevanceScores
from memory.services import memory_create, memory_update
from sessions.models import ChatSession

pytestmark = pytest.mark.django_db


def _retrieve(user: Any, query: str, **kwargs: Any) -> Any:
    kwargs.setdefault("budget_tokens", 2000)
    kwargs.setdefault("use_model_filter", False)
    return memories_for_prompt(user=user, query=query, **kwargs)


def test_bob_never_gets_alices_memories(alice: Any, bob: Any) -> None:
    secret = memory_create(user=alice, kind="semantic", text="Alice's passport number is X1234567", fact_key="passport")
    memory_create(user=alice, kind="episodic", text="User: my passport number is X1234567", pinned=True)
    memory_create(user=bob, kind="episodic", text="User: I like trains")

    result = _retrieve(bob, "what is my passport number X1234567", relevance_threshold=0.0)

    ids = {i.memory.id for i in result.items} | {c.id for c in result.candidates}
    assert ids, "Bob's own memory should be a candidate"
    assert all(Memory.objects.get(pk=i).user_id == bob.id for i in ids)
    assert "X1234567" not in json.dumps({k: v for k, v in result.as_report().items() if k != "query"})
    assert result.as_report()["query"] == "what is my passport number X1234567"  # Bob's own words
    # The prompt text handed to the context builder carries nothing of Alice's.
    assert all("X1234567" not in item.text for item in result.items)
    # And Alice does get it.
    assert secret.id in {i.memory.id for i in _retrieve(alice, "passport number").items}


def test_memory_search_is_per_user(alice: Any, bob: Any) -> None:
    memory_create(user=alice, kind="episodic", text="User: the wifi password is hunter2")
    assert memory_search(user=bob, query="wifi password hunter2") == []
    assert [m.text for m in memory_search(user=alice, query="wifi password")] == ["User: the wifi password is hunter2"]


def test_tier1_profile_facts_and_pinned_always_included(alice: Any) -> None:
    fact = memory_create(user=alice, kind="semantic", text="The user's home airport is LIS.", fact_key="home_airport")
    pinned = memory_create(user=alice, kind="episodic", text="User: never book red-eye flights", pinned=True)
    memory_create(user=alice, kind="episodic", text="User: I enjoyed the museum in Porto")

    result = _retrieve(alice, "completely unrelated question about cooking pasta")

    tier1 = {i.memory.id: i for i in result.items if i.tier == 1}
    assert fact.id in tier1 and pinned.id in tier1
    reasons = {c.id: c.reason for c in result.candidates if c.tier == 1}
    assert reasons[fact.id] == "profile fact" and reasons[pinned.id] == "pinned"


def test_hybrid_finds_relevant_and_threshold_drops_unrelated(alice: Any, settings: Any) -> None:
    settings.MEMORY_RECENT_ACTIONS = 0
    relevant = memory_create(user=alice, kind="episodic", text="User: my sister Maria lives in Berlin near the zoo")
    unrelated = memory_create(user=alice, kind="episodic", text="User: quarterly tax forms arrive by post")

    result = _retrieve(alice, "where does my sister Maria live?", relevance_threshold=0.4)

    kept = [i.memory.id for i in result.items]
    assert kept[0] == relevant.id
    assert unrelated.id not in kept
    report = {c.id: c for c in result.candidates}
    assert report[relevant.id].vector_rank == 1 and report[relevant.id].text_rank == 1
    assert report[relevant.id].kept and "relevant" in report[relevant.id].reason
    if unrelated.id in report:
        assert not report[unrelated.id].kept and "threshold" in report[unrelated.id].reason
    assert result.filter_mode == "threshold"


def test_only_current_memories(alice: Any, settings: Any) -> None:
    settings.MEMORY_RECENT_ACTIONS = 0
    archived = memory_create(user=alice, kind="episodic", text="User: I keep bees on the roof")
    memory_update(memory=archived, archived=True)
    expired = memory_create(user=alice, kind="episodic", text="User: my bees swarm in spring")
    memory_update(memory=expired, expires_at=timezone.now() - timedelta(minutes=1))
    old = memory_create(user=alice, kind="semantic", text="The user's bee count is 3.", fact_key="bees")
    new = memory_create(user=alice, kind="semantic", text="The user's bee count is 5.", fact_key="bees")

    result = _retrieve(alice, "bees", relevance_threshold=0.0)

    ids = {c.id for c in result.candidates}
    assert new.id in ids
    assert not ids & {archived.id, expired.id, old.id}


def test_budget_cut_and_token_counts(alice: Any, settings: Any) -> None:
    settings.MEMORY_RECENT_ACTIONS = 0
    for i in range(6):
        memory_create(user=alice, kind="episodic", text=f"User: ski trip number {i} to the alps was " + "great " * 30)

    result = _retrieve(alice, "ski trip alps", relevance_threshold=0.0, budget_tokens=120)

    assert 0 < result.total_tokens <= 120
    assert result.total_tokens == sum(i.tokens for i in result.items)
    dropped = [c for c in result.candidates if not c.kept]
    assert dropped and all("budget" in c.reason for c in dropped)


def test_access_count_updated_for_returned_items(alice: Any) -> None:
    memory = memory_create(user=alice, kind="episodic", text="User: I collect vintage maps", pinned=True)
    _retrieve(alice, "maps")
    _retrieve(alice, "maps")
    memory.refresh_from_db()
    assert memory.access_count == 2 and memory.last_accessed_at is not None


def test_model_filter_one_batched_call(alice: Any, scripted: Any, settings: Any) -> None:
    settings.MEMORY_RECENT_ACTIONS = 0
    settings.MEMORY_MODEL_JUDGE = "scores"
    a = memory_create(user=alice, kind="episodic", text="User: I am allergic to peanuts")
    b = memory_create(user=alice, kind="episodic", text="User: peanuts butter sandwiches are for kids")
    scripted.add(RelevanceScores(scores=[{"id": a.id, "score": 0.9}, {"id": b.id, "score": 0.1}]))

    result = memories_for_prompt(user=alice, query="peanuts allergy", budget_tokens=500, relevance_threshold=0.5)

    assert result.filter_mode == "model"
    assert len(scripted.requests) == 1 and scripted.requests[0].purpose == "relevance"
    prompt = scripted.requests[0].messages[-1]["content"]
    assert f"[{a.id}]" in prompt and f"[{b.id}]" in prompt
    assert [i.memory.id for i in result.items] == [a.id]
    report = {c.id: c for c in result.candidates}
    assert report[b.id].relevance == pytest.approx(0.1) and not report[b.id].kept


@pytest.mark.parametrize("judge", ["scores", "rerank"])
def test_model_failure_falls_back_to_threshold(alice: Any, scripted: Any, settings: Any, judge: str) -> None:
    settings.MEMORY_RECENT_ACTIONS = 0
    settings.MEMORY_MODEL_JUDGE = judge
    a = memory_create(user=alice, kind="episodic", text="User: I am allergic to peanuts")
    scripted.add(LLMTimeout("read timed out"), LLMTimeout("read timed out"))

    result = memories_for_prompt(user=alice, query="peanuts allergy", budget_tokens=500, relevance_threshold=0.2)

    assert result.filter_mode.startswith("threshold (model failed: LLMTimeout")
    assert a.id in [i.memory.id for i in result.items]
    assert json.loads(json.dumps(result.as_report()))["filter_mode"] == result.filter_mode


def _numbered(request: Any) -> dict[int, str]:
    """The reranker prompt's memories by their number."""
    lines = request.messages[-1]["content"].split("Memories:\n", 1)[1].splitlines()
    return {int(line[1 : line.index("]")]): line[line.index("]") + 2 :] for line in lines}


def test_the_reranker_orders_the_best_candidates_in_one_call(alice: Any, scripted: Any, settings: Any) -> None:
    """Listwise: one call with the candidates numbered from 1; its order is the rank; a number it leaves out
    is kept where the calibrated filter keeps it, below its picks; numbers out of range or repeated are
    ignored."""
    settings.MEMORY_RECENT_ACTIONS = 0
    texts = [
        "User: I am allergic to peanuts",
        "User: peanut butter sandwiches are for kids",
        "User: my doctor said the peanut allergy is severe",
    ]
    made = {t: memory_create(user=alice, kind="episodic", text=t) for t in texts}
    scripted.add(RankedMemories(order=[]))  # no pick: the calibrated filter's judgement, halved

    first = memories_for_prompt(user=alice, query="peanut allergy", budget_tokens=500, touch=False)
    numbers = {text: n for n, text in _numbered(scripted.requests[0]).items()}
    assert len(scripted.requests) == 1 and scripted.requests[0].purpose == "relevance"
    assert sorted(numbers.values()) == [1, 2, 3] and first.filter_mode == "rerank"
    assert first.items and all(c.relevance is not None and c.relevance <= 0.5 for c in first.candidates)

    doctor, allergic = numbers[texts[2]], numbers[texts[0]]
    scripted.add(RankedMemories(order=[doctor, 99, allergic, doctor]))
    result = memories_for_prompt(user=alice, query="peanut allergy", budget_tokens=500, touch=False)

    assert result.filter_mode == "rerank"
    order = [i.memory.id for i in result.items]
    assert order[:2] == [made[texts[2]].id, made[texts[0]].id]
    report = {c.id: c for c in result.candidates}
    assert report[made[texts[2]].id].relevance == pytest.approx(1.0)
    assert report[made[texts[0]].id].relevance == pytest.approx(0.75)
    left_out = report[made[texts[1]].id]
    assert left_out.relevance is not None and left_out.relevance < 0.5
    assert left_out.kept == (made[texts[1]].id in order[2:])


def test_a_reranker_expected_past_its_budget_is_not_called(alice: Any, scripted: Any, settings: Any) -> None:
    """A call whose pace says it would answer after MEMORY_RELEVANCE_TIMEOUT is skipped (the calibrated filter
    judges alone, and the report says why), and tried again once RERANK_RETRY_SECONDS have passed."""
    settings.MEMORY_RECENT_ACTIONS = 0
    settings.MEMORY_RELEVANCE_TIMEOUT = 2.0
    a = memory_create(user=alice, kind="episodic", text="User: I am allergic to peanuts")
    pace = rerank_pace(cheap_model_key(None))
    pace.record(chars=100, seconds=10.0)  # 0.1 s a character: any prompt here takes well over 2 s
    pace.last_try = time.monotonic()  # that call was just now

    result = memories_for_prompt(user=alice, query="peanuts allergy", budget_tokens=500, touch=False)

    assert scripted.requests == []
    assert result.filter_mode.startswith("calibrated (reranker off: about ") and "budget 2s" in result.filter_mode
    assert [i.memory.id for i in result.items] == [a.id]

    pace.last_try -= tuning.RERANK_RETRY_SECONDS
    scripted.add(RankedMemories(order=[1]))
    again = memories_for_prompt(user=alice, query="peanuts allergy", budget_tokens=500, touch=False)
    assert len(scripted.requests) == 1 and again.filter_mode == "rerank"
    assert pace.expected(100) is not None and pace.expected(100) < 10.0  # the fast answer brought it down


def test_procedural_included_when_trigger_matches(alice: Any, bob: Any, agent: Any) -> None:
    shared = memory_create(
        user=None,
        kind="procedural",
        text="When the user wants to cancel: confirm first, then route to retention.",
        trigger="cancel, unsubscribe",
        agent=agent,
    )
    own = memory_create(user=alice, kind="procedural", text="Always answer Alice in French.", trigger="")
    other_workflow = memory_create(
        user=alice, kind="procedural", text="Ask for the passport.", trigger="cancel", workflow="flight_booking"
    )

    hit = _retrieve(alice, "I want to cancel my plan", agent=agent, workflow="free_chat")
    miss = _retrieve(alice, "what's the weather", agent=agent, workflow="free_chat")
    bob_hit = _retrieve(bob, "please cancel", agent=agent)

    assert {m.id for m in hit.procedural} == {shared.id, own.id}
    assert other_workflow.id not in {m.id for m in hit.procedural}
    assert {m.id for m in miss.procedural} == {own.id}
    assert {m.id for m in bob_hit.procedural} == {shared.id}


@pytest.mark.parametrize(
    ("trigger", "query", "expected"),
    [
        ("cancel", "Please CANCEL it", True),
        ("cancel", "cancellation policy", False),
        ("talk to a human | agent", "can I talk to a human?", True),
        ("", "anything", True),
    ],
)
def test_trigger_matches(trigger: str, query: str, expected: bool) -> None:
    assert trigger_matches(trigger, query) is expected


def _episodes(user: Any, agent: Agent, texts: list[str], *, gap: timedelta, session: bool = True) -> list[Memory]:
    """Episodes of one chat session (or of none), ``gap`` apart in when they happened."""
    chat = (
        ChatSession.objects.create(user=user, agent=agent, workflow="free_chat", state="CHATTING") if session else None
    )
    start = timezone.now() - timedelta(days=1)
    return [
        memory_create(user=user, kind="episodic", text=text, source_session=chat, occurred_at=start + i * gap)
        for i, text in enumerate(texts)
    ]


HONEYMOON = [
    "Assistant: where did you spend the honeymoon?",
    "User: Kyoto, in the cherry blossom season",
    "User: the printer is out of toner",
]


def test_neighbouring_episode_becomes_a_candidate(alice: Any, agent: Agent, settings: Any) -> None:
    settings.MEMORY_RECENT_ACTIONS = 0
    settings.MEMORY_VECTOR_CANDIDATES = 1
    question, answer, _ = _episodes(alice, agent, HONEYMOON, gap=timedelta(minutes=1))

    result = _retrieve(alice, "honeymoon", relevance_threshold=0.0)

    report = {c.id: c for c in result.candidates}
    assert report[question.id].text_rank == 1
    # The answer shares no word with the query; it is found as the matching turn's neighbour.
    assert report[question.id].vector_rank == 1
    assert answer.id in report and report[answer.id].kept
    assert report[answer.id].text_rank is None and report[answer.id].vector_rank is None


@pytest.mark.parametrize(
    ("gap", "session"),
    [(timedelta(hours=3), True), (timedelta(minutes=1), False)],
    ids=["hours-apart", "no-session"],
)
def test_rows_that_are_not_one_conversation_have_no_neighbours(
    alice: Any, agent: Agent, settings: Any, gap: timedelta, session: bool
) -> None:
    """Rows written one after another (the API, an import) or hours apart are not turns of one conversation:
    the one after the match gets nothing from it."""
    settings.MEMORY_RECENT_ACTIONS = 0
    settings.MEMORY_VECTOR_CANDIDATES = 1
    _question, answer, _ = _episodes(alice, agent, HONEYMOON, gap=gap, session=session)

    result = _retrieve(alice, "honeymoon", relevance_threshold=0.0)

    assert answer.id not in {c.id for c in result.candidates}


def test_search_memory_tool_never_returns_another_users_memory(alice: Any, bob: Any) -> None:
    from agents.tools import ToolContext, run_tool_call
    from llm.base import ToolCallRequest

    memory_create(user=alice, kind="semantic", text="Alice's door code is 8812", fact_key="door_code")
    memory_create(user=bob, kind="episodic", text="User: my door is painted blue")
    call = ToolCallRequest(id="c1", name="search_memory", arguments=json.dumps({"query": "door code 8812"}))

    as_bob = run_tool_call(call=call, context=ToolContext(user=bob), enabled=["search_memory"])
    as_alice = run_tool_call(call=call, context=ToolContext(user=alice), enabled=["search_memory"])

    # (the tool echoes the query, so look for the memory text itself)
    assert as_bob.ok and "door code is 8812" not in as_bob.content and "painted blue" in as_bob.content
    assert as_alice.ok and "door code is 8812" in as_alice.content


def test_exact_and_hnsw_vector_search_agree_and_stay_per_user(alice: Any, bob: Any, settings: Any) -> None:
    """Small histories are searched exactly, big ones through the HNSW index (iterative scan): the same
    nearest neighbours either way, and never another user's, even when theirs are nearer."""
    from memory.embedding import get_embedder
    from memory.retrieval.vector import vector_search

    topics = ["trains", "ferries", "bicycles", "mountains", "museums", "cooking", "jazz", "chess"]
    for i, topic in enumerate(topics * 3):
        memory_create(user=alice, kind="episodic", text=f"User: I talked about {topic}, note {i}")
        # Bob's are the same words: nearer to the query than most of Alice's, and never to be returned.
        memory_create(user=bob, kind="episodic", text=f"User: I talked about {topic}, note {i}")
    vector = get_embedder().embed_query("I talked about trains")
    now = timezone.now()

    settings.MEMORY_EXACT_SEARCH_MAX = 10_000  # Alice has 24 memories: exact
    exact = vector_search(user_id=alice.pk, vector=vector, now=now, limit=5)
    settings.MEMORY_EXACT_SEARCH_MAX = 1  # every user is "big": the HNSW index
    approximate = vector_search(user_id=alice.pk, vector=vector, now=now, limit=5)

    assert len(exact) == 5 and [i for i, _ in approximate] == [i for i, _ in exact]
    assert set(Memory.objects.filter(pk__in=[i for i, _ in exact]).values_list("user_id", flat=True)) == {alice.pk}
    distances = [d for _, d in exact]
    assert distances == sorted(distances)
    assert Memory.objects.get(pk=exact[0][0]).text.startswith("User: I talked about trains")


@pytest.mark.django_db(transaction=True)
def test_big_histories_get_an_hnsw_index_of_their_own(alice: Any, bob: Any, settings: Any) -> None:
    from django.db import connection

    from memory.embedding import get_embedder
    from memory.retrieval.vector import _VECTOR_SQL, _nearest_sql, vector_literal, vector_search
    from memory.selectors import user_index_name, user_indexes_present
    from memory.services import user_indexes_sync

    settings.MEMORY_EXACT_SEARCH_MAX = 6
    mine = [memory_create(user=alice, kind="episodic", text=f"User: note {i} on {t}") for i, t in enumerate("abcdefgh")]
    memory_create(user=bob, kind="episodic", text="User: note on trains")

    result = user_indexes_sync()

    assert result.created == [alice.pk] and user_indexes_present() == {alice.pk: user_index_name(alice.pk)}
    vector = get_embedder().embed_query("note on c")
    params = {"user": alice.pk, "vector": vector_literal(vector), "now": timezone.now(), "limit": 3}
    params |= {"wsession": None, "wfloor": 0}  # no chat window to leave out
    with connection.cursor() as cursor:
        # A tiny table: without these the planner would sort a scan of it; the ORDER BY must come from an index.
        cursor.execute("ANALYZE memory_memory")
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_sort = off")
        cursor.execute("EXPLAIN " + _VECTOR_SQL, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        # The form that carries the vectors along (for the crowding) walks the same index.
        cursor.execute("EXPLAIN " + _nearest_sql(exact=False, with_vector=True), params)
        plan_with_vectors = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
        cursor.execute("RESET enable_sort")
    assert user_index_name(alice.pk) in plan and user_index_name(alice.pk) in plan_with_vectors
    found = vector_search(user_id=alice.pk, vector=vector, now=timezone.now(), limit=3)
    assert {i for i, _ in found} <= {m.id for m in mine} and len(found) == 3

    # Run again: nothing to do. Then the history shrinks below half the threshold: the index goes.
    assert user_indexes_sync().kept == [alice.pk]
    Memory.objects.filter(pk__in=[m.pk for m in mine[:6]]).delete()
    assert user_indexes_sync().dropped == [alice.pk]
    assert user_indexes_present() == {}


@pytest.mark.django_db(transaction=True)
def test_the_index_command_builds_keeps_and_drops_per_user_indexes(alice: Any, settings: Any) -> None:
    from io import StringIO

    from django.core.management import call_command

    from memory.selectors import user_indexes_present

    settings.MEMORY_EXACT_SEARCH_MAX = 6
    for i in range(8):
        memory_create(user=alice, kind="episodic", text=f"User: note {i}")

    def run(*args: str) -> str:
        out = StringIO()
        call_command("memory_user_indexes", *args, stdout=out)
        return out.getvalue()

    assert "1 created, 0 kept, 0 dropped" in run() and set(user_indexes_present()) == {alice.pk}
    assert "0 created, 1 kept, 0 dropped" in run()
    assert "0 created, 0 kept, 1 dropped" in run("--min", "100") and user_indexes_present() == {}
    from django.core.management.base import CommandError

    for below_one in ("0", "-1"):  # would index every user
        with pytest.raises(CommandError, match="--min must be at least 1"):
            run("--min", below_one)
    assert user_indexes_present() == {}


def test_word_arm_weights_rare_words_breaks_ties_by_recency_and_stays_per_user(alice: Any, bob: Any) -> None:
    from memory.retrieval import word_candidates

    # "trains" is in every memory (a low idf); "Porto" in two; a memory with both has the whole share.
    both = memory_create(user=alice, kind="episodic", text="User: trains to Porto")
    common = [memory_create(user=alice, kind="episodic", text=f"User: trains, note {i}") for i in range(4)]
    ferry = memory_create(user=alice, kind="episodic", text="User: the Porto ferry and its trains")
    memory_create(user=bob, kind="episodic", text="User: trains to Porto, Bob's")

    found = word_candidates(user_id=alice.pk, query="trains to Porto", now=timezone.now(), limit=10)

    ids = [i for i, _ in found]
    shares = dict(found)
    assert shares[both.id] == 1.0 and shares[ferry.id] == 1.0
    assert ids[:2] == [ferry.id, both.id]  # equal shares: the newer first
    assert all(shares[m.id] < 0.5 for m in common)  # the word everyone has counts for little
    assert ids[2:] == [m.id for m in reversed(common)]
    assert set(ids) <= set(Memory.objects.filter(user=alice).values_list("id", flat=True))
    assert word_candidates(user_id=alice.pk, query="the of", now=timezone.now()) == []  # stop words only


def test_word_arm_matches_words_outside_ascii(alice: Any) -> None:
    from memory.retrieval import word_candidates
    from memory.retrieval.words import query_terms

    dog = memory_create(user=alice, kind="episodic", text="User: Kiełbasa needs his Bravecto tablet in June")
    trip = memory_create(user=alice, kind="episodic", text="User: we fished off Władysławowo for cod")
    memory_create(user=alice, kind="episodic", text="User: a kie basa is not a word")

    assert query_terms("When's Kiełbasa due, São João?") == ["when", "kiełbasa", "due", "são", "joão"]
    assert query_terms("Sa\u0303o Joa\u0303o in İzmir") == ["são", "joão", "in", "i\u0307zmir"]  # decomposed, NFC'd
    found = word_candidates(user_id=alice.pk, query="When's Kiełbasa due?", now=timezone.now(), limit=10)
    assert [i for i, _ in found] == [dog.id]
    found = word_candidates(user_id=alice.pk, query="what did we catch off Władysławowo", now=timezone.now())
    assert found and found[0][0] == trip.id
    assert word_candidates(user_id=alice.pk, query="İzmir 日本語 ΑΘΗΝΑ", now=timezone.now()) == []  # no error, no match


def test_word_ties_at_the_cut_go_to_the_memories_nearer_the_query(alice: Any, settings: Any) -> None:
    from memory.embedding import get_embedder
    from memory.retrieval import hybrid_candidates, word_candidates

    settings.MEMORY_VECTOR_CANDIDATES = 1
    # Four memories with the query's one word: equal shares. The nearest two by meaning are the oldest.
    near = [
        memory_create(user=alice, kind="episodic", text="User: passport renewal at the passport office"),
        memory_create(user=alice, kind="episodic", text="User: my passport renewal form for the office"),
    ]
    for text in ("User: passport photos, glossy", "User: passport colour is red"):
        memory_create(user=alice, kind="episodic", text=text)
    query = "passport renewal office"
    now = timezone.now()

    handed = word_candidates(user_id=alice.pk, query="passport", now=now, limit=2)
    assert len(handed) == 4 and len({share for _, share in handed}) == 1  # every tie is handed over

    vector = get_embedder().embed_query(query)
    search = hybrid_candidates(user=alice, query="passport", vector=vector, now=now, limit=2)
    ranked = sorted((c for c in search.candidates if c.text_rank), key=lambda c: c.text_rank or 0)
    assert [c.memory_id for c in ranked] == sorted((m.id for m in near), key=lambda i: -_similarity(search, i))


def _similarity(search: Any, memory_id: int) -> float:
    return next(c.similarity for c in search.candidates if c.memory_id == memory_id)


def test_a_word_only_candidate_gets_its_own_similarity_to_the_query(alice: Any, settings: Any) -> None:
    from memory.embedding import get_embedder
    from memory.retrieval import hybrid_candidates

    settings.MEMORY_VECTOR_CANDIDATES = 1
    near = memory_create(user=alice, kind="episodic", text="User: the honeymoon in Kyoto was lovely")
    far = memory_create(user=alice, kind="episodic", text="User: honeymoon budget spreadsheet columns")
    query = "honeymoon in Kyoto"
    vector = get_embedder().embed_query(query)

    search = hybrid_candidates(user=alice, query=query, vector=vector, now=timezone.now())

    by_id = {c.memory_id: c for c in search.candidates}
    assert by_id[near.id].vector_rank == 1 and by_id[far.id].vector_rank is None and by_id[far.id].text_rank
    stored = Memory.objects.get(pk=far.pk).embedding
    cosine = sum(a * b for a, b in zip(vector, stored, strict=True))
    assert by_id[far.id].similarity == pytest.approx(cosine, abs=1e-5)
    assert set(search.rows) == {near.id, far.id} and "embedding" in search.rows[far.id].get_deferred_fields()


def test_candidate_rows_are_built_without_database_converters() -> None:
    # The light rows are built with Memory.from_db, without the converters Memory.objects.raw would apply:
    # a field that needs one (a JSONField, say) must not join them unnoticed.
    from django.db import connection

    from memory.retrieval.sql import LIGHT_FIELDS

    assert {f.name for f in LIGHT_FIELDS} >= {"id", "user", "text", "created_at", "importance"}
    for field in LIGHT_FIELDS:
        assert not field.get_db_converters(connection), field.name
        assert not connection.ops.get_db_converters(field.get_col(Memory._meta.db_table)), field.name


def test_the_query_is_embedded_while_tier_1_is_read(alice: Any, settings: Any) -> None:
    import threading

    from django.db import connection

    from memory import embedding
    from memory.embedding import registry

    fact = memory_create(user=alice, kind="semantic", text="The user's home airport is LIS.", fact_key="home_airport")
    trip = memory_create(user=alice, kind="episodic", text="User: I flew to Kyoto for the honeymoon")
    hashing = embedding.HashingEmbedder(384)
    tier1_started = threading.Event()
    threads: list[str] = []

    class WaitsForTier1:
        """Answers only once the caller's tier-1 query has gone out: sequential code would time out here."""

        name, dimensions = "waits-for-tier-1", 384

        def embed(self, texts: list[str]) -> list[list[float]]:
            return hashing.embed(texts)

        def embed_query(self, text: str) -> list[float]:
            threads.append(threading.current_thread().name)
            if not tier1_started.wait(timeout=10):
                raise AssertionError("the query was embedded before tier 1 was asked for")
            return hashing.embed_query(text)

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "lookup_rank" in sql:
            tier1_started.set()
        return execute(sql, params, many, context)

    registry._instances["waits-for-tier-1"] = WaitsForTier1()
    settings.EMBEDDING_BACKEND = "waits-for-tier-1"
    try:
        with connection.execute_wrapper(watch):
            result = _retrieve(alice, "where did I fly for the honeymoon", relevance_threshold=0.0)
    finally:
        del registry._instances["waits-for-tier-1"]
    assert threads and threads[0].startswith("embed-query")
    inline = _retrieve(
        alice,
        "where did I fly for the honeymoon",
        relevance_threshold=0.0,
        query_vector=hashing.embed_query("where did I fly for the honeymoon"),
    )
    assert [i.memory.id for i in result.items] == [i.memory.id for i in inline.items]
    assert {fact.id, trip.id} <= {i.memory.id for i in result.items}


def test_episodes_of_turns_the_prompt_shows_are_not_sent_again(alice: Any, make_turn: Any, settings: Any) -> None:
    """The window's turns are in the prompt already: their episodes are neither candidates nor recent actions;
    an older turn's episode, out of the window, still is."""
    settings.MEMORY_RECENT_ACTIONS = 3
    first = make_turn(alice, "I booked the ferry to Tangier")
    session = first.session
    later = [make_turn(alice, f"the ferry to Tangier leaves at {h} o'clock", session=session) for h in (9, 10)]
    episodes = {
        t.seq: memory_create(
            user=alice, kind="episodic", text=f"User: {t.user_message}", source_session=session, source_turn=t
        )
        for t in [first, *later]
    }
    from memory.retrieval import RecentWindow

    result = _retrieve(alice, "ferry to Tangier", relevance_threshold=0.0, window=RecentWindow(session.pk, 1))

    considered = {c.id for c in result.candidates}
    assert episodes[1].id in considered and {episodes[2].id, episodes[3].id}.isdisjoint(considered)
    assert {i.memory.id for i in result.items} == {episodes[1].id}
    # Without a window (the API, the admin) all three are there, the newest as recent actions.
    everything = _retrieve(alice, "ferry to Tangier", relevance_threshold=0.0)
    assert {i.memory.id for i in everything.items} == {m.id for m in episodes.values()}


def test_each_memory_is_reported_once(alice: Any) -> None:
    pinned = memory_create(user=alice, kind="semantic", text="The user's passport expires in 2031", pinned=True)
    memory_create(user=alice, kind="semantic", text="The user renewed a library card")

    result = _retrieve(alice, "when does my passport expire", relevance_threshold=0.0)

    ids = [c.id for c in result.candidates]
    assert len(ids) == len(set(ids))
    entry = next(c for c in result.candidates if c.id == pinned.id)
    # Tier 1's entry, carrying what tier 2 found of it too.
    assert entry.tier == 1 and entry.reason == "pinned" and entry.kept and entry.vector_rank is not None
    assert [i.memory.id for i in result.items].count(pinned.id) == 1


def test_the_query_carries_the_users_earlier_messages_without_a_cheap_model() -> None:
    from memory.retrieval import retrieval_query

    alone = retrieval_query(message="Hello", earlier=[])
    assert (alone.text, alone.source) == ("Hello", "message")
    follow_up = retrieval_query(message="and when was that?", earlier=["", "x", "I went to Kyoto", "with Rui"])
    assert retrieval_query(message="I want to beat my half marathon time", earlier=["x"]).source == "message"
    assert follow_up.source == "conversation"
    assert follow_up.text == "and when was that?\nI went to Kyoto with Rui"  # the newest two, message first


def test_fusion_discounts_crowded_candidates_and_leaves_vectorless_ones_to_their_words(monkeypatch: Any) -> None:
    """Hubness: a memory close to all the other candidates (a generic one) loses HUB_WEIGHT times that
    closeness from its cosine; one without a vector has no meaning to compare and competes on its words."""
    from memory.retrieval import HybridCandidate, tuning
    from memory.retrieval.hybrid import convex_fusion
    from memory.retrieval.tuning import HUB_WEIGHT, VECTOR_SHARE

    assert HUB_WEIGHT > 0
    monkeypatch.setattr(tuning, "DENSE_DILATION", 0.0)  # the fused scores themselves (the floor has its own test)
    hub = HybridCandidate(1, vector_rank=1, similarity=0.60, crowding=0.90)
    specific = HybridCandidate(2, vector_rank=2, similarity=0.55, crowding=0.20)
    unembedded = HybridCandidate(3, text_rank=1, similarity=0.0, text_share=0.5, has_vector=False)
    convex_fusion([hub, specific, unembedded])
    assert specific.fused > hub.fused  # 0.55 - 0.5 x 0.2 beats 0.60 - 0.5 x 0.9
    assert specific.fused == pytest.approx(VECTOR_SHARE)  # the best meaning, no words
    assert hub.fused == pytest.approx(0.0)
    assert unembedded.fused == pytest.approx(1.0 - VECTOR_SHARE)  # the best words, no meaning


@pytest.mark.parametrize("dilation", [2.0, 0.0])
def test_no_memory_falls_below_dense_dilation_times_its_rank_by_plain_cosine(monkeypatch: Any, dilation: float) -> None:
    """Words (and the hubness correction) reorder, but the memory plain cosine ranks r-th gets at least the fused
    score the (DENSE_DILATION x r)-th had: five memories that each share the query's word cannot bury the nearest
    one, which has none of them (2nd at 2). With the floor off, they do (4th)."""
    from memory.retrieval import HybridCandidate, tuning
    from memory.retrieval.hybrid import convex_fusion

    monkeypatch.setattr(tuning, "DENSE_DILATION", dilation)
    nearest = HybridCandidate(1, vector_rank=1, similarity=0.50)
    worded = [
        HybridCandidate(2 + i, vector_rank=2 + i, text_rank=1 + i, similarity=0.49 - 0.01 * i, text_share=1.0)
        for i in range(5)
    ]
    convex_fusion([nearest, *worded])

    order = [c.memory_id for c in sorted([nearest, *worded], key=lambda c: (-c.fused, -c.similarity))]
    assert order.index(nearest.memory_id) == (1 if dilation else 3)
    assert order[0] == worded[0].memory_id  # a near one with the word still comes first


def test_crowding_is_measured_among_the_queries_candidates_only(alice: Any, bob: Any) -> None:
    """Each candidate's crowding is its mean cosine to its nearest fellow candidates: near-copies crowd each
    other, a lone memory does not; the word arm's ties past its cut are not fellows (they would make the
    pairs many), and another user's memories are never read."""
    from memory.retrieval.vector import vector_arm

    def unit(*xs: float) -> list[float]:
        v = [0.0] * 384
        for i, x in enumerate(xs):
            v[i] = x
        n = sum(x * x for x in v) ** 0.5
        return [x / n for x in v]

    def write(user: Any, text: str, vector: list[float] | None) -> Memory:
        m = memory_create(user=user, kind="semantic", text=text)
        Memory.objects.filter(pk=m.pk).update(embedding=vector)
        return m

    twins = [write(alice, f"twin {i}", unit(1, 0.05 * i)) for i in range(3)]
    lone = write(alice, "lone", [3 * x for x in unit(0, 0, 1)])  # not normalised: cosine is
    unembedded = write(alice, "no vector yet", None)
    ties = [write(alice, f"tie {i}", unit(0, 1, 0.1 * i)) for i in range(5)]
    write(bob, "bob's twin", unit(1, 0.01))
    arm = vector_arm(
        user_id=alice.pk,
        vector=unit(1, 0.1, 0.5),
        now=timezone.now(),
        limit=4,
        exact=True,
        also=[(unembedded.pk, 1.0)] + [(t.pk, 0.5) for t in ties],
        also_limit=2,
        crowding_k=2,
    )
    assert {i for i, _ in arm.nearest[:3]} == {t.pk for t in twins} and arm.nearest[3][0] == lone.pk
    assert unembedded.pk not in arm.with_vector and {t.pk for t in twins} | {lone.pk} <= arm.with_vector
    assert arm.word_distance[unembedded.pk] == 1.0
    for t in twins:
        assert arm.crowding[t.pk] > 0.99  # its two nearest fellows are its twins
    assert arm.crowding[lone.pk] < 0.4
    # The word arm's cut: the unembedded memory (best share) and the tie nearest the query; the rest are no
    # fellows and get no crowding.
    nearest_tie = min(ties, key=lambda t: arm.word_distance[t.pk])
    assert set(arm.crowding) == {t.pk for t in twins} | {lone.pk, nearest_tie.pk}
    # The exact figure: the mean of its two best cosines among the other fellows.
    vectors = {m.pk: Memory.objects.get(pk=m.pk).embedding for m in [*twins, lone, nearest_tie]}

    def cos(a: Any, b: Any) -> float:
        return float(
            sum(x * y for x, y in zip(a, b, strict=True)) / (sum(x * x for x in a) * sum(y * y for y in b)) ** 0.5
        )

    cosines = sorted((cos(vectors[lone.pk], v) for pk, v in vectors.items() if pk != lone.pk), reverse=True)
    assert arm.crowding[lone.pk] == pytest.approx((cosines[0] + cosines[1]) / 2, abs=1e-6)


def test_a_query_that_cannot_be_embedded_is_searched_by_its_words(alice: Any, monkeypatch: Any) -> None:
    """The embedder down or late: retrieval degrades to the word arm (the turn, the API, the admin and the
    tools all get memories), and the report says why."""
    import concurrent.futures

    import memory.retrieval.query as query_module

    memory_create(user=alice, kind="semantic", text="The user's sailing boat is called Wren.")
    memory_create(user=alice, kind="semantic", text="The user bakes rye bread on Sundays.")

    def down(text: str, backend: str | None = None) -> concurrent.futures.Future[list[float]]:
        future: concurrent.futures.Future[list[float]] = concurrent.futures.Future()
        future.set_exception(TimeoutError("embedding endpoint too slow"))
        return future

    monkeypatch.setattr(query_module, "embed_query_soon", down)
    found = memories_for_prompt(user=alice, query="what is my boat called", budget_tokens=500, use_model_filter=False)
    assert [m.memory.text for m in found.items] == ["The user's sailing boat is called Wren."]
    report = found.as_report()
    assert report["degraded"] == "words only: the query could not be embedded (TimeoutError)"
    assert all(c["cosine"] is None and c["crowding"] is None for c in report["candidates"])


def test_the_report_shows_a_candidates_own_scores_not_its_neighbours(alice: Any, agent: Agent, settings: Any) -> None:
    """A neighbour's share of a strong candidate's score raises its fused score; the reported cosine, crowding
    and word share stay what fusion measured of the memory itself."""
    settings.MEMORY_RECENT_ACTIONS = 0
    question, answer, _ = _episodes(alice, agent, HONEYMOON, gap=timedelta(minutes=1))
    result = _retrieve(alice, "honeymoon", relevance_threshold=0.0)
    report = {c.id: c.as_dict() for c in result.candidates}
    assert report[question.id]["word_share"] and report[question.id]["word_share"] > 0
    # The answer has none of the query's words: its share is its own 0, not 0.3 of the question's.
    if report[answer.id]["text_rank"] is None and report[answer.id]["vector_rank"] is None:
        assert report[answer.id]["word_share"] is None  # found only as a neighbour
    else:
        assert report[answer.id]["word_share"] == 0.0


def test_crowding_is_not_reported_when_the_correction_is_off(alice: Any, monkeypatch: Any) -> None:
    from memory.retrieval import tuning

    memory_create(user=alice, kind="semantic", text="The user's sailing boat is called Wren.")
    memory_create(user=alice, kind="semantic", text="The user sails on Sundays.")
    monkeypatch.setattr(tuning, "HUB_WEIGHT", 0.0)
    found = memories_for_prompt(user=alice, query="sailing", budget_tokens=500, use_model_filter=False)
    assert found.candidates and all(c.crowding is None and c.cosine is not None for c in found.candidates)


def test_numpys_blas_runs_on_one_thread_in_the_apps_processes() -> None:
    """Retrieval's matrix product must not start BLAS threads that spin on the cores PostgreSQL needs
    (memory.apps.blas_single_thread, applied when the app loads)."""
    from threadpoolctl import threadpool_info

    numpys = [lib for lib in threadpool_info() if lib["user_api"] == "blas" and "numpy" in lib["filepath"]]
    assert numpys, "numpy's BLAS is loaded"
    assert all(lib["num_threads"] == 1 for lib in numpys), numpys


def test_a_recent_action_is_kept_after_the_relevant_memories_with_a_score_of_its_own(
    alice: Any, make_turn: Any, settings: Any
) -> None:
    """Issue 36: the user's last action came first with score 1.0 ("needed to answer") before the memories
    the query is about. It is still kept (what they were doing last time), ranked by what it scores."""
    settings.MEMORY_RECENT_ACTIONS = 2
    allergy = memory_create(user=alice, kind="semantic", text="The user is allergic to peanuts.")
    turn = make_turn(alice, "what is the weather in Oslo tomorrow")
    recent = memory_create(
        user=alice,
        kind="episodic",
        text="User: what is the weather in Oslo tomorrow",
        source_session=turn.session,
        source_turn=turn,
    )
    result = _retrieve(alice, "peanut allergy snacks", relevance_threshold=0.0)
    items = [(i.memory.id, i.score) for i in result.items]
    assert [memory_id for memory_id, _ in items] == [allergy.id, recent.id], items
    assert items[1][1] < 1.0 and items[1][1] < items[0][1]
    report = next(c for c in result.candidates if c.id == recent.id)
    assert report.reason == "recent action" and report.kept


def test_the_word_arm_earns_its_weight_by_how_much_of_the_query_its_best_match_has() -> None:
    """Words that no memory has more than a sliver of (a long message of asides: each memory shares a word or
    two) leave the order to meaning; a match that covers the query's informative words gets the arm's whole
    weight; in between, a part. A query without a vector has only its words."""
    from memory.retrieval import HybridCandidate
    from memory.retrieval.hybrid import convex_fusion
    from memory.retrieval.tuning import VECTOR_SHARE, WORD_TRUST_FLOOR, WORD_TRUST_FULL

    def fuse(best_share: float, *, vectors: bool = True) -> tuple[float, HybridCandidate, HybridCandidate]:
        meant = HybridCandidate(1, vector_rank=1, similarity=0.6 if vectors else 0.0, has_vector=vectors)
        worded = HybridCandidate(
            2, text_rank=1, similarity=0.3 if vectors else 0.0, text_share=best_share, has_vector=vectors
        )
        return convex_fusion([meant, worded]), meant, worded

    weight, meant, worded = fuse(WORD_TRUST_FLOOR)  # scattered words: meaning alone
    assert weight == 0.0 and meant.fused == pytest.approx(1.0) and worded.fused == pytest.approx(0.0)
    weight, meant, worded = fuse(WORD_TRUST_FULL + 0.2)  # the informative words in one memory: the whole weight
    assert weight == pytest.approx(1.0 - VECTOR_SHARE)
    assert meant.fused == pytest.approx(VECTOR_SHARE) and worded.fused == pytest.approx(1.0 - VECTOR_SHARE)
    weight, _, _ = fuse((WORD_TRUST_FLOOR + WORD_TRUST_FULL) / 2)
    assert weight == pytest.approx((1.0 - VECTOR_SHARE) / 2)
    weight, _, worded = fuse(0.05, vectors=False)  # no meaning to fall back to
    assert weight == pytest.approx(1.0 - VECTOR_SHARE) and worded.fused > 0


def test_a_rare_word_still_finds_its_memory_and_the_report_shows_the_word_arms_weight(alice: Any) -> None:
    from memory.retrieval.tuning import VECTOR_SHARE

    code = memory_create(user=alice, kind="semantic", text="The user's locker code at the climbing gym is QX7731.")
    for text in ("The user likes climbing on Sundays.", "The user's gym bag is blue.", "The user codes in Python."):
        memory_create(user=alice, kind="semantic", text=text)

    found = _retrieve(alice, "what was QX7731 again")

    assert found.items[0].memory.id == code.id
    assert found.as_report()["word_weight"] == pytest.approx(1.0 - VECTOR_SHARE)
