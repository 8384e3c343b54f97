"""Turn overhead: the server-side cost of one turn without model time, this app against LangGraph.

Both sides get the same instant fake model (``llm.scripted.ScriptedProvider`` answering "ok"), the
same deterministic hashing embedder (so embedding time is near zero on both sides), the same tiktoken
counter and budgets, the same memories and the same user messages, on the same embedded PostgreSQL:

- ours: ``orchestrator.runtime.turn_run`` on a free-chat agent (no tools): advisory lock, idempotency, the
  ``Turn`` row and checkpoints, tiered memory retrieval (vector + full text, threshold filter), the context
  builder over the saved history, the model call with its ``LLMCall`` audit row, the saved reply and the
  after-commit enqueue of memory writes and summaries (to Redis when it is reachable, else in memory);
- LangGraph: a one-node ``StateGraph`` with ``PostgresSaver`` (durability "sync") and ``PostgresStore``
  (pgvector index, same embedder) in its own database: the node reads the history from the checkpointed
  state, searches the store (top 10), trims memories and history to the same budgets with the same counter,
  calls the fake model, and the checkpointer saves the new state.

Our summary worker keeps up, as in production: between two of our turns, untimed, the bench folds the
requested turns into the summary (``OurSide.summary_worker``). Both databases get planner statistics
(``ANALYZE``) after seeding, as autovacuum gives a live database.

The two run interleaved (one turn each, alternately) so machine noise hits both alike. LangGraph's fake
model call skips our provider's bookkeeping (the ``LLMCall`` row is counted on our side only).

Then, on 50 more of our turns, the time our turn waits for PostgreSQL (every statement and commit, by
area: retrieval, turn state, the model-call record, the lock): the floor of our turn's cost, and the
ratio that floor alone gives against LangGraph's whole turn.

Run alone: ``python -m bench turn_overhead [-- --turns 200 --warmup 20 --memories 300 --profile --phases]``
(``--turns 1000 --buckets 100``: how both sides grow with the length of the conversation);
needs ``requirements-bench.txt`` (``make bench`` installs it into ``.venv-peers``).
"""

from __future__ import annotations

import argparse
import json
import operator
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

from bench.turn_statements import count_turn_statements

RESULTS = Path(__file__).resolve().parent / "results"
OUR_DATABASE = "bench_turn_overhead"
LANGGRAPH_DATABASE = "bench_turn_overhead_langgraph"
MEMORY_TOP_K = 10
GOAL_RATIO = 0.5  # ours / LangGraph, p50 (retired: that side does less work than our turn)
LIKE_FOR_LIKE_GOAL = 0.8  # ours / LangGraph doing the same work, p50 and p95
STATEMENT_GOALS = {"chat": 10, "decision": 14, "tool": 18}
DATABASE_TURNS = 50  # turns over which our database time is measured, after the measured ones


@dataclass
class Side:
    name: str
    samples_ms: list[float]

    def summary(self) -> dict[str, float]:
        xs = self.samples_ms
        return {
            "p50_ms": round(statistics.median(xs), 2),
            "p95_ms": round(statistics.quantiles(xs, n=20)[18], 2),
            "mean_ms": round(statistics.fmean(xs), 2),
            "turns": len(xs),
        }


def user_messages(count: int, *, seed: int = 7) -> list[str]:
    """Realistic, varied user messages (the context benchmark's topics and phrasings)."""
    from bench.context_bench import DETAILS, QUESTIONS, TOPICS

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        text = rng.choice(QUESTIONS).format(topic=rng.choice(TOPICS))
        if rng.random() < 0.4:
            text += " " + rng.choice(DETAILS)
        out.append(text)
    return out


def memory_texts(count: int) -> list[str]:
    from bench.context_bench import MEMORY_POOL, TOPICS

    return [
        f"{MEMORY_POOL[i % len(MEMORY_POOL)]} Noted while discussing {TOPICS[(i // len(MEMORY_POOL)) % len(TOPICS)]} "
        f"(note {i})."
        for i in range(count)
    ]


def _percentile_ratio(ours: dict[str, float], theirs: dict[str, float], key: str) -> float:
    return round(ours[key] / theirs[key], 3) if theirs[key] else float("nan")


# --------------------------------------------------------------------------------------------------
# Ours
# --------------------------------------------------------------------------------------------------


def _route_celery_to_a_throwaway_queue() -> Callable[[], None]:
    """After-commit enqueues go to a private Redis queue (deleted afterwards), or memory without Redis."""
    import redis

    from config.celery import app

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    url = "redis://127.0.0.1:6379/14"
    try:
        redis.Redis.from_url(url, socket_timeout=0.5).ping()
    except Exception:  # noqa: BLE001 - no Redis: an in-process broker keeps the enqueue cheap and local
        url = "memory://"
    app.conf.update(broker_url=url, broker_transport_options={}, task_default_queue=queue)
    # Producers made for the old broker must go: drop the pool so the next enqueue builds a new one.
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None

    def cleanup() -> None:
        if url.startswith("redis"):
            redis.Redis.from_url(url).delete(queue)

    return cleanup


class OurSide:
    def __init__(self, *, memories: list[str]) -> None:
        from django.contrib.auth import get_user_model

        from agents.models import Agent
        from bench.context_bench import SYSTEM_PROMPT
        from llm.demo import DemoModel
        from llm.scripted import ScriptedProvider
        from memory.models import Memory
        from memory.services import memory_create
        from sessions.services import session_create

        User = get_user_model()
        User.objects.filter(username="bench-turns").delete()
        Agent.objects.filter(slug="bench-turns").delete()
        self.user = User.objects.create(username="bench-turns")
        self.agent = Agent.objects.create(
            name="Bench", slug="bench-turns", system_prompt=SYSTEM_PROMPT, workflow="free_chat", tools=[]
        )
        for text in memories:
            memory_create(user=self.user, kind=Memory.Kind.EPISODIC, text=text)
        self.session = session_create(user=self.user, agent=self.agent)
        _analyze(_conninfo(OUR_DATABASE))
        self.model = ScriptedProvider(default="ok")
        # The relevance filter asks the cheap model; the demo model there means "no filter model" (the
        # threshold path), as LangGraph has no relevance model either.
        self.no_filter = DemoModel()

    def provider(self, _agent: Any, cheap: bool) -> Any:
        return self.no_filter if cheap else self.model

    def turn(self, message: str) -> float:
        """One turn, timed (milliseconds); then, untimed, the summary worker's share of it."""
        elapsed = self.timed_turn(message)
        self.summary_worker()
        return elapsed

    def timed_turn(self, message: str) -> float:
        from orchestrator.runtime import turn_run

        started = time.perf_counter()
        result = turn_run(session=self.session, message=message)
        elapsed = (time.perf_counter() - started) * 1000
        if result.reply != "ok":
            raise RuntimeError(f"our turn did not complete: {result.turn.status} {result.turn.error}")
        return elapsed

    def summary_worker(self) -> None:
        """What the summary worker does in production, on its own process: fold the requested turns into
        the session's summary. Here it runs between turns, outside the timing, so every turn meets the
        history a worker that keeps up leaves (the window plus a few turns), as LangGraph's side meets
        its whole history. Without it the backlog would grow by a turn a turn, up to 200 turns read,
        token-counted and degraded on every turn, which is the cost of a worker that is down."""
        from sessions.models import ChatSession
        from sessions.summaries import summarize_session_through

        requested, through = ChatSession.objects.filter(pk=self.session.pk).values_list(
            "summary_requested_seq", "summary_through_seq"
        )[0]
        if requested > through:
            summarize_session_through(session_id=self.session.pk, through_seq=requested)

    def budgets(self) -> tuple[int, int, str]:
        """(history budget, memory budget, counter model) for the LangGraph side to use too."""
        from sessions.context import ContextBudget

        budget = ContextBudget.from_agent(self.agent)
        memories = min(int(self.agent.memory_budget_tokens), budget.section_limit("memories"))
        return budget.section_limit("recent"), memories, self.model.model


# --------------------------------------------------------------------------------------------------
# LangGraph
# --------------------------------------------------------------------------------------------------


class LGState(TypedDict):
    messages: Annotated[list[dict[str, str]], operator.add]


def _conninfo(dbname: str) -> str:
    from django.db import connections
    from psycopg.conninfo import make_conninfo

    s = connections["default"].settings_dict
    parts = {"host": s["HOST"] or None, "port": s["PORT"] or None, "user": s["USER"], "password": s["PASSWORD"]}
    return make_conninfo(dbname=dbname, **{k: v for k, v in parts.items() if v})


def _recreate_database(name: str) -> None:
    import psycopg

    with psycopg.connect(_conninfo("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _analyze(conninfo: str) -> None:
    """Planner statistics for the seeded tables, as autovacuum gives a live database (it would come here
    only a minute after the seeding, partway through the run)."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("ANALYZE")


def _newest_within(history: list[dict[str, str]], counter: Any, budget: int) -> list[dict[str, str]]:
    """The newest messages of ``history`` whose tokens fit ``budget`` (at least one), oldest first."""
    kept: list[dict[str, str]] = []
    used = 0
    for message in reversed(history):  # newest first, until the budget is spent
        tokens = counter.count_messages([message])
        if kept and used + tokens > budget:
            break
        kept.append(message)
        used += tokens
    return kept[::-1]


class _GraphSide:
    """A LangGraph side: ``graph`` and ``config`` built by the subclass, its resources on ``_stack``."""

    graph: Any
    config: dict[str, Any]
    _stack: Any

    def turn(self, message: str) -> float:
        started = time.perf_counter()
        out = self.graph.invoke({"messages": [{"role": "user", "content": message}]}, self.config, durability="sync")
        elapsed = (time.perf_counter() - started) * 1000
        if out["messages"][-1]["content"] != "ok":
            raise RuntimeError(f"the {type(self).__name__} turn did not complete")
        return elapsed

    def close(self) -> None:
        self._stack.close()


class LangGraphSide(_GraphSide):
    def __init__(
        self, *, memories: list[str], system_prompt: str, history_budget: int, memory_budget: int, model: str
    ) -> None:
        from contextlib import ExitStack

        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.store.postgres import PostgresStore

        from llm.scripted import ScriptedProvider
        from llm.tokens import counter_for
        from memory.embedding import get_embedder

        _recreate_database(LANGGRAPH_DATABASE)
        self._stack = ExitStack()
        conn = _conninfo(LANGGRAPH_DATABASE)
        embedder = get_embedder("hashing")
        self.saver = self._stack.enter_context(PostgresSaver.from_conn_string(conn))
        self.saver.setup()
        self.store = self._stack.enter_context(
            PostgresStore.from_conn_string(
                conn,
                index={
                    "dims": embedder.dimensions,
                    "embed": embedder.embed,
                    "fields": ["text"],
                    "distance_type": "cosine",
                },
            )
        )
        self.store.setup()
        self.namespace = ("memories", "bench-turns")
        for i, text in enumerate(memories):
            self.store.put(self.namespace, f"m{i}", {"text": text})
        _analyze(conn)
        counter = counter_for(model)
        fake = ScriptedProvider(default="ok", model=model)
        store = self.store
        namespace = self.namespace

        def respond(state: LGState) -> dict[str, Any]:
            history = state["messages"]
            query = history[-1]["content"]
            found = store.search(namespace, query=query, limit=MEMORY_TOP_K)
            memory_lines: list[str] = []
            used = 0
            for item in found:
                line = f"- {item.value['text']}"
                tokens = counter.count(line)
                if used + tokens > memory_budget:
                    break
                memory_lines.append(line)
                used += tokens
            kept = _newest_within(history, counter, history_budget)
            prompt = [
                {"role": "system", "content": system_prompt},
                {"role": "system", "content": "What you remember about the user:\n" + "\n".join(memory_lines)},
                *kept,
            ]
            raw = fake._request(prompt, temperature=None, max_tokens=None, tools=None, schema=None, purpose="reply")
            return {"messages": [{"role": "assistant", "content": raw.text}]}

        builder = StateGraph(LGState)
        builder.add_node("respond", respond)
        builder.add_edge(START, "respond")
        builder.add_edge("respond", END)
        self.graph = builder.compile(checkpointer=self.saver, store=self.store)
        self.config = {"configurable": {"thread_id": f"bench-{uuid.uuid4().hex[:8]}"}}


class LangGraphLikeForLikeSide(_GraphSide):
    """LangGraph doing the work our turn does, on the same PostgreSQL: a ``retrieve`` node that runs this app's
    own hybrid retrieval (``memory.retrieval.memories_for_prompt``, the same SQL over the same memories, with the
    same budgets and threshold) and builds the prompt with the same counter; a checkpoint after it, so one
    stands before the model call (``PostgresSaver``, durability "sync"); a ``call_model`` node that calls the fake
    model and writes an audit row for the call (a table like ``LLMCall``, in LangGraph's database); and the
    checkpoint after it, with the reply. Memory writes and summaries stay out of both timings (ours enqueues
    them after the commit; here they would be a background job too)."""

    AUDIT_TABLE = "bench_llm_calls"

    def __init__(self, *, ours: OurSide, system_prompt: str, history_budget: int, model: str) -> None:
        from contextlib import ExitStack

        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph

        from llm.scripted import ScriptedProvider
        from llm.tokens import counter_for
        from memory.retrieval import memories_for_prompt

        name = LANGGRAPH_DATABASE + "_full"
        _recreate_database(name)
        self._stack = ExitStack()
        conn = _conninfo(name)
        self.saver = self._stack.enter_context(PostgresSaver.from_conn_string(conn))
        self.saver.setup()
        audit = self._stack.enter_context(psycopg.connect(conn, autocommit=True))
        audit.execute(
            f"CREATE TABLE {self.AUDIT_TABLE} (id bigserial PRIMARY KEY, thread text, purpose text, model text, "
            "prompt_tokens int, completion_tokens int, latency_ms double precision, outcome text, "
            "prompt_sections jsonb, created_at timestamptz DEFAULT now())"
        )
        counter = counter_for(model)
        fake = ScriptedProvider(default="ok", model=model)
        agent, user = ours.agent, ours.user
        thread = f"bench-{uuid.uuid4().hex[:8]}"

        def retrieve(state: LGFullState) -> dict[str, Any]:
            history = state["messages"]
            query = history[-1]["content"]
            found = memories_for_prompt(
                user=user,
                query=query,
                agent=agent,
                workflow="free_chat",
                budget_tokens=agent.memory_budget_tokens,
                relevance_threshold=agent.relevance_threshold,
                touch=False,
            )
            kept = _newest_within(history, counter, history_budget)
            memory_lines = "\n".join(f"- {item.text}" for item in found.items)
            prompt = [
                {"role": "system", "content": system_prompt},
                {"role": "system", "content": "What you remember about the user:\n" + memory_lines},
                *kept,
            ]
            return {"prompt": prompt, "prompt_tokens": counter.count_messages(prompt)}

        def call_model(state: LGFullState) -> dict[str, Any]:
            started = time.perf_counter()
            raw = fake._request(
                state["prompt"], temperature=None, max_tokens=None, tools=None, schema=None, purpose="reply"
            )
            latency = (time.perf_counter() - started) * 1000
            audit.execute(
                f"INSERT INTO {self.AUDIT_TABLE} (thread, purpose, model, prompt_tokens, completion_tokens, "
                "latency_ms, outcome, prompt_sections) VALUES (%s, 'reply', %s, %s, %s, %s, 'ok', %s)",
                [thread, model, state["prompt_tokens"], 1, latency, json.dumps({"total": state["prompt_tokens"]})],
            )
            return {"messages": [{"role": "assistant", "content": raw.text}], "prompt": []}

        builder = StateGraph(LGFullState)
        builder.add_node("retrieve", retrieve)
        builder.add_node("call_model", call_model)
        builder.add_edge(START, "retrieve")
        builder.add_edge("retrieve", "call_model")
        builder.add_edge("call_model", END)
        self.graph = builder.compile(checkpointer=self.saver)
        self.config = {"configurable": {"thread_id": thread}}


class LGFullState(TypedDict, total=False):
    messages: Annotated[list[dict[str, str]], operator.add]
    prompt: list[dict[str, str]]
    prompt_tokens: int


# --------------------------------------------------------------------------------------------------


# Where each statement's time goes, by the table it is about (first match wins).
_AREAS = (
    ("memory_memory", "memory retrieval"),
    ("agents_llmcall", "model-call record"),
    ("chat_sessions_", "turn state (turn row, checkpoint, session)"),
    ("pg_", "session lock"),
)


def _database_time(ours: OurSide, messages: list[str]) -> dict[str, Any]:
    """What our turns spend waiting for PostgreSQL, per turn over ``messages``: every statement's execute
    call and every commit, timed in the client (so the round trip is in it), by area (``_AREAS``).

    The floor of the turn's cost: what it would cost if all of our Python were free."""
    from django.db import connection

    per_area: dict[str, float] = {}
    kinds: dict[str, int] = {}
    statements = 0
    timing = False

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            area = next((label for marker, label in _AREAS if marker in sql), "other")
            per_area[area] = per_area.get(area, 0.0) + time.perf_counter() - started
            verb = sql.lstrip("( \n").split(" ", 1)[0].upper()
            kinds[verb] = kinds.get(verb, 0) + 1
            statements += 1

    commit = connection._commit

    def timed_commit() -> Any:
        started = time.perf_counter()
        try:
            return commit()
        finally:
            if timing:
                per_area["commits"] = per_area.get("commits", 0.0) + time.perf_counter() - started
                kinds["COMMIT"] = kinds.get("COMMIT", 0) + 1

    connection._commit = timed_commit  # type: ignore[method-assign]
    turn_ms = 0.0
    try:
        for message in messages:
            timing = True
            with connection.execute_wrapper(wrapper):
                turn_ms += ours.timed_turn(message)
            timing = False
            ours.summary_worker()
    finally:
        del connection._commit  # back to the class's method
    n = len(messages)
    ms = {area: round(seconds * 1000 / n, 2) for area, seconds in sorted(per_area.items(), key=lambda kv: -kv[1])}
    return {
        "turns": n,
        "statements_per_turn": round(statements / n, 1),
        "by_kind_per_turn": {k: round(v / n, 1) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "database_ms_per_turn": round(sum(per_area.values()) * 1000 / n, 2),
        "by_area_ms_per_turn": ms,
        "turn_ms": round(turn_ms / n, 2),
    }


def _profile_ours(ours: OurSide, messages: list[str]) -> str:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    for message in messages:
        profiler.start()
        ours.timed_turn(message)
        profiler.stop()
        ours.summary_worker()
    return profiler.output_text(unicode=False, color=False, show_all=False)


# The runtime's steps, timed per turn by wrapping them where the runtime looks them up (module attributes).
_PHASES = (
    ("orchestrator.runtime", "turn_begin", "turn_begin: lock, session, Turn row with its checkpoint"),
    ("orchestrator.begin", "session_for_turn", "  session, last turn number, orphans"),
    ("orchestrator.begin", "turn_insert", "  the turn, its checkpoint and title (one statement)"),
    ("orchestrator.steps", "turn_history", "history read"),
    ("orchestrator.steps", "memories_for_prompt", "memory retrieval (tiers 1-4)"),
    ("orchestrator.reply", "build_prompt", "prompt build and token counts"),
    ("orchestrator.reply", "complete_turn", "completing the turn (incl. after-commit work)"),
    ("orchestrator.finish", "after_turn", "  after-commit work"),
    ("orchestrator.finish", "summary_request_if_due", "    summary check"),
    ("orchestrator.finish", "memory_writes_enqueue", "    memory-write enqueue"),
)


def _phases_ours(ours: OurSide, messages: list[str]) -> dict[str, float]:
    """Milliseconds per turn spent in each of the runtime's steps (``_PHASES``) over ``messages``."""
    import functools
    import importlib

    spent = dict.fromkeys((label for _, _, label in _PHASES), 0.0)
    originals: list[tuple[Any, str, Any]] = []

    def timed(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - started

        return wrapper

    for module_name, name, label in _PHASES:
        module = importlib.import_module(module_name)
        originals.append((module, name, getattr(module, name)))
        setattr(module, name, timed(getattr(module, name), label))
    try:
        total = 0.0
        for message in messages:
            total += ours.timed_turn(message) / 1000
            ours.summary_worker()
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)
    per_turn = {label: round(seconds * 1000 / len(messages), 2) for label, seconds in spent.items()}
    return {"whole turn": round(total * 1000 / len(messages), 2), **per_turn}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench turn_overhead", description=__doc__)
    parser.add_argument("--turns", type=int, default=200, help="measured turns per side")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured turns per side first")
    parser.add_argument("--memories", type=int, default=300, help="memories of the user on each side")
    parser.add_argument("--profile", action="store_true", help="then profile 50 more of our turns with pyinstrument")
    parser.add_argument(
        "--phases", action="store_true", help="then time the runtime's steps over 200 more of our turns"
    )
    parser.add_argument(
        "--buckets",
        type=int,
        default=0,
        help="also print both sides' p50 per this many measured turns (how each grows with the thread's length)",
    )
    parser.add_argument("--no-write", action="store_true")
    args, _ = parser.parse_known_args(argv)

    from django.conf import settings

    from bench.context_bench import SYSTEM_PROMPT
    from bench.memory_db import use_database
    from llm.providers import provider_override

    try:
        import langgraph  # noqa: F401
    except ImportError:
        print(
            "langgraph is not installed: `make bench` installs requirements-bench.txt into .venv-peers and runs "
            "there (or: .venv-peers/bin/python -m bench turn_overhead)",
            file=sys.stderr,
        )
        return 1

    settings.EMBEDDING_BACKEND = "hashing"
    # As in production: DEBUG's query log and debug cursor wrapper are not part of a turn's cost.
    settings.DEBUG = False
    cleanup = _route_celery_to_a_throwaway_queue()
    # A new database for each run, as LangGraph's side gets: every run starts from the same state, not from
    # the previous runs' deleted rows (dead tuples in the tables and indexes until autovacuum comes).
    _recreate_database(OUR_DATABASE)
    use_database(OUR_DATABASE)
    texts = memory_texts(args.memories)
    extra = DATABASE_TURNS + (50 if args.profile else 0) + (200 if args.phases else 0)
    messages = user_messages(args.warmup + args.turns + extra)
    ours = OurSide(memories=texts)
    history_budget, memory_budget, model = ours.budgets()
    theirs = LangGraphSide(
        memories=texts,
        system_prompt=SYSTEM_PROMPT,
        history_budget=history_budget,
        memory_budget=memory_budget,
        model=model,
    )
    full = LangGraphLikeForLikeSide(ours=ours, system_prompt=SYSTEM_PROMPT, history_budget=history_budget, model=model)
    ours_ms: list[float] = []
    theirs_ms: list[float] = []
    full_ms: list[float] = []
    profile = ""
    phases: dict[str, float] = {}
    database: dict[str, Any] = {}
    try:
        with provider_override(ours.provider):
            sides: list[tuple[Any, list[float]]] = [(ours, ours_ms), (theirs, theirs_ms), (full, full_ms)]
            for i, message in enumerate(messages[: args.warmup + args.turns]):
                # Rotate which side goes first so none always runs on a warmer cache.
                for side, samples in sides[i % 3 :] + sides[: i % 3]:
                    elapsed = side.turn(message)
                    if i >= args.warmup:
                        samples.append(elapsed)
            rest = messages[args.warmup + args.turns :]
            database = _database_time(ours, rest[:DATABASE_TURNS])
            rest = rest[DATABASE_TURNS:]
            if args.profile:
                profile = _profile_ours(ours, rest[:50])
                rest = rest[50:]
            if args.phases:
                phases = _phases_ours(ours, rest[:200])
        statements = {kind: counted.as_dict() for kind, counted in count_turn_statements().items()}
    finally:
        theirs.close()
        full.close()
        cleanup()

    o, t = Side("ours", ours_ms).summary(), Side("langgraph", theirs_ms).summary()
    f = Side("langgraph_like_for_like", full_ms).summary()
    ratio = {"p50": _percentile_ratio(o, t, "p50_ms"), "p95": _percentile_ratio(o, t, "p95_ms")}
    ratio_full = {"p50": _percentile_ratio(o, f, "p50_ms"), "p95": _percentile_ratio(o, f, "p95_ms")}
    statement_counts = {kind: c["statements"] for kind, c in statements.items()}
    statements_met = all(statement_counts[k] <= STATEMENT_GOALS[k] for k in STATEMENT_GOALS)
    report = {
        "benchmark": "server-side cost of one turn without model time (instant fake model, hashing embedder)",
        "ours": o,
        "langgraph": t,
        "ratio_ours_over_langgraph": ratio,
        "goal": f"ours at most {GOAL_RATIO:.0%} of LangGraph's (retired: that side does less work)",
        "goal_met": ratio["p50"] <= GOAL_RATIO and ratio["p95"] <= GOAL_RATIO,
        "langgraph_like_for_like": f,
        "ratio_ours_over_langgraph_like_for_like": ratio_full,
        "goal_like_for_like": f"ours at most {LIKE_FOR_LIKE_GOAL:.0%} of the like-for-like side's",
        "goal_like_for_like_met": ratio_full["p50"] <= LIKE_FOR_LIKE_GOAL and ratio_full["p95"] <= LIKE_FOR_LIKE_GOAL,
        "statements_per_turn": statement_counts,
        "transactions_per_turn": {kind: c["transactions"] for kind, c in statements.items()},
        "statements_by_kind": {kind: c["by_kind"] for kind, c in statements.items()},
        "statement_goals": STATEMENT_GOALS,
        "statement_goals_met": statements_met,
        "ours_database_time": database,
        # Our database time alone over LangGraph's whole turn: the ratio if all of our Python were free.
        "ratio_floor_database_only": round(database["database_ms_per_turn"] / t["p50_ms"], 3),
        **({"ours_phases_ms_per_turn": phases} if phases else {}),
        "setup": {
            "memories_per_side": args.memories,
            "warmup_turns": args.warmup,
            "history_budget_tokens": history_budget,
            "memory_budget_tokens": memory_budget,
            "memory_top_k_langgraph": MEMORY_TOP_K,
            "celery_broker": _broker_label(),
            "langgraph": _versions(),
        },
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print(f"{'turn overhead (ms)':<22}{'p50':>10}{'p95':>10}{'mean':>10}")
    for name, s in (("this app", o), ("LangGraph", t), ("LangGraph, same work", f)):
        print(f"{name:<22}{s['p50_ms']:>10.2f}{s['p95_ms']:>10.2f}{s['mean_ms']:>10.2f}")
    print(
        f"{'ratio ours/LangGraph':<22}{ratio['p50']:>10.3f}{ratio['p95']:>10.3f}   (old goal <= {GOAL_RATIO}, retired)"
    )
    print(
        f"{'ratio ours/same work':<22}{ratio_full['p50']:>10.3f}{ratio_full['p95']:>10.3f}   "
        f"goal <= {LIKE_FOR_LIKE_GOAL}: {'met' if report['goal_like_for_like_met'] else 'NOT met'}"
    )
    print(
        "statements per turn: "
        + ", ".join(
            f"{k} {statement_counts[k]} (goal <= {STATEMENT_GOALS[k]}, "
            f"{report['transactions_per_turn'][k]} transactions)"
            for k in STATEMENT_GOALS
        )
        + f": {'met' if statements_met else 'NOT met'}"
    )
    if args.buckets > 0:
        print(f"p50 per {args.buckets} turns (after {args.warmup} warm-up turns):")
        for start in range(0, len(ours_ms), args.buckets):
            a = statistics.median(ours_ms[start : start + args.buckets])
            b = statistics.median(theirs_ms[start : start + args.buckets])
            print(
                f"  turns {start + 1:>5}-{start + args.buckets:<5} ours {a:7.2f}  LangGraph {b:7.2f}  ratio {a / b:.2f}"
            )
    areas = ", ".join(f"{area} {ms:.2f}" for area, ms in database["by_area_ms_per_turn"].items())
    print(
        f"our turn in the database ({database['turns']} more turns): {database['statements_per_turn']:g} "
        f"statements, {database['database_ms_per_turn']:.2f} of {database['turn_ms']:.2f} ms ({areas})"
    )
    budget = GOAL_RATIO * t["p50_ms"]
    print(
        f"floor, if all of our Python were free: ratio {report['ratio_floor_database_only']:.3f} "
        f"(the goal's budget is {budget:.2f} ms a turn; the database work alone is "
        f"{database['database_ms_per_turn'] / budget:.1f}x that)"
    )
    if phases:
        print("our turn's steps, ms per turn over 200 more turns (nested lines are part of the line above):")
        for label, ms in phases.items():
            print(f"  {label:<52}{ms:>8.2f}")
    if profile:
        where = "/tmp/turn_overhead_profile.txt" if args.no_write else "bench/results/turn_overhead_profile.txt"
        print(f"pyinstrument profile of 50 more turns: {where}")
        if args.no_write:
            Path(where).write_text(profile)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "turn_overhead.json").write_text(json.dumps(report, indent=2) + "\n")
        if profile:
            (RESULTS / "turn_overhead_profile.txt").write_text(profile)
    return 0


def _broker_label() -> str:
    from config.celery import app

    return str(app.conf.broker_url).split("://", 1)[0]


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("langgraph", "langgraph-checkpoint-postgres")}


if __name__ == "__main__":
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    raise SystemExit(main(sys.argv[1:]))
