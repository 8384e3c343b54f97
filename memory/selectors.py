"""Reads of memory: the tiered retrieval every door uses (runtime, API, admin, the search_memory tool).

Tiers:
1. exact lookups: the user's profile facts (semantic, with a ``fact_key``), pinned memories, recent actions;
2. hybrid candidates for this user only: cosine search (exact for histories under MEMORY_EXACT_SEARCH_MAX;
   above it the user's own partial HNSW index, or the shared one with pgvector 0.8 iterative scans so the
   user filter cannot starve it) and idf-weighted full-text search, fused on the query's own scale, with
   the episodes next to the best candidates in their chat session pulled in;
3. a relevance filter: one batched cheap-model call scoring every candidate, or the calibrated filter (on
   the query's own scale) when no model is configured, the call fails, or it is slower than its time
   budget, or an operator's absolute cut-off;
4. ranking by relevance, importance and recency (when it happened), at most MEMORY_MAX_KEPT memories and
   the memory token budget.

The query is the message, or what ``retrieval_query`` makes of it with the conversation. Episodes of the
turns the prompt shows (``RecentWindow``) are left out. docs/memory.md has the measurements.

Every query here filters on the requesting user: no path returns another user's memory (shared
procedures, with no user, are everyone's).
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Q, QuerySet
from django.utils import timezone

from llm.base import CallContext
from llm.providers import agent_profile, get_provider
from llm.tokens import counter_for
from memory.access import memories_touch
from memory.embedding import embed_query_soon, get_embedder
from memory.models import Memory
from memory.schemas import RelevanceScores, SearchQuery

if TYPE_CHECKING:
    from agents.models import Agent
    from llm.base import Purpose, SchemaT

logger = logging.getLogger(__name__)

# Every constant below was chosen on the tuning split of bench/memory_eval.py (every 4th query of each of
# its corpora); docs/memory.md has the held-out figures and the command.
FUSION = "cc"  # "rrf": reciprocal rank fusion; "cc": convex combination of the arms' scores (_convex_fusion)
VECTOR_SHARE = 0.6  # "cc": the cosine's share of the fused score when the word arm has earned its whole weight
# "cc": the word arm earns its weight (1 - VECTOR_SHARE) per query, by how much of the query's information its
# best match covers: the idf-weighted share of the query's words that the best-matching memory has. At or under
# WORD_TRUST_FLOOR no memory answers to the query's words as a whole: they are scattered over memories that
# each share an incidental word or two (a long message of several utterances: "work", "dinner", a name said
# in passing), and the fused score is meaning alone. From WORD_TRUST_FULL the word arm has its whole weight
# (a question whose informative words, a name, a code, a place, one memory has); linear in between.
WORD_TRUST_FLOOR = 0.2
WORD_TRUST_FULL = 0.3
RRF_K = 10  # reciprocal-rank-fusion constant: lower than the usual 60, so top ranks dominate
VECTOR_WEIGHT, TEXT_WEIGHT = 1.0, 1.5  # the arms' shares in the fusion
# Hubness: some memories sit close to everything (generic, long or chatty ones) and so come near the top
# for any query. A candidate's cosine is discounted by HUB_WEIGHT times its crowding: its mean cosine to
# its HUB_K nearest fellow candidates of this query (a local CSLS-style correction; 0 = off).
HUB_WEIGHT = 0.5
HUB_K = 10
HUB_FELLOWS = 64  # at most this many of each arm's best are fellows (the pairs grow with its square)
NEIGHBOUR_WEIGHT = 0.3  # share of a candidate's score given to the episodes next to it in its session (0 = off)
NEIGHBOUR_SOURCES = 20  # how many of the best candidates spread to their neighbours
NEIGHBOUR_MAX_GAP = timedelta(hours=1)  # episodes further apart than this are not neighbours
TEXT_POOL = 1000  # newest full-text matches scored per query (bounds the work for users with huge histories)
RECENCY_HALF_LIFE_DAYS = 30.0
WEIGHT_RELEVANCE, WEIGHT_IMPORTANCE, WEIGHT_RECENCY = 0.8, 0.1, 0.1
# The default relevance filter (no model, or its call failed): a candidate is kept when its fused score is at
# least this share of the query's best candidate's. With FUSION "cc" the fused score is on the query's own
# scale already (cosine and word share each between this query's worst and best): one absolute cut-off over
# cosine and word share (0.5) starved whole queries on data it was not tuned on.
RELATIVE_KEEP = 0.3
PREVIEW_CHARS = 160
MODEL_FILTER_CHARS = 400  # per memory in the relevance prompt
PROFILE_LIMIT = 20
PINNED_LIMIT = 20
_WORD = re.compile(r"[A-Za-z0-9]+")


@dataclass
class RetrievedMemory:
    memory: Memory
    text: str  # as it goes into the prompt
    score: float
    tier: int
    tokens: int


@dataclass
class CandidateReport:
    id: int
    kind: str
    preview: str
    tier: int
    vector_rank: int | None = None
    text_rank: int | None = None
    fused_score: float = 0.0
    relevance: float | None = None
    kept: bool = False
    reason: str = ""
    # What the fused score is made of (tier 2): the cosine to the query, the crowding it lost HUB_WEIGHT of,
    # and the idf-weighted share of the query's words. None where tier 2 did not score the memory.
    cosine: float | None = None
    crowding: float | None = None
    word_share: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "preview": self.preview,
            "tier": self.tier,
            "vector_rank": self.vector_rank,
            "text_rank": self.text_rank,
            "fused_score": round(self.fused_score, 6),
            "relevance": None if self.relevance is None else round(self.relevance, 4),
            "kept": self.kept,
            "reason": self.reason,
            "cosine": None if self.cosine is None else round(self.cosine, 4),
            "crowding": None if self.crowding is None else round(self.crowding, 4),
            "word_share": None if self.word_share is None else round(self.word_share, 4),
        }

    def scored_by(self, cand: HybridCandidate) -> None:
        self.vector_rank, self.text_rank, self.fused_score = cand.vector_rank, cand.text_rank, cand.fused
        if cand.scored is not None:  # None: only a neighbour of a strong candidate (a share of that one's score)
            self.cosine, self.crowding, self.word_share = cand.scored


@dataclass
class RetrievedMemories:
    items: list[RetrievedMemory] = field(default_factory=list)
    procedural: list[Memory] = field(default_factory=list)
    candidates: list[CandidateReport] = field(default_factory=list)
    total_tokens: int = 0
    budget_tokens: int = 0
    filter_mode: str = "calibrated"
    degraded: str = ""  # why a part of the search was skipped (the query's embedding failed), or empty
    query: str = ""  # the text searched for (see retrieval_query)
    query_source: str = "message"
    timings_ms: dict[str, float] = field(default_factory=dict)
    word_weight: float | None = None  # the word arm's share of the fused score, earned on this query (tier 2)

    def as_report(self) -> dict[str, Any]:
        """JSON-able summary for ``Turn.retrieval``, the inspector and the API."""
        return {
            "query": self.query,
            "query_source": self.query_source,
            "items": [
                {
                    "id": i.memory.id,
                    "kind": i.memory.kind,
                    "tier": i.tier,
                    "score": round(i.score, 4),
                    "tokens": i.tokens,
                }
                for i in self.items
            ],
            "procedural": [
                {"id": m.id, "trigger": m.trigger, "preview": m.text[:PREVIEW_CHARS]} for m in self.procedural
            ],
            "candidates": [c.as_dict() for c in self.candidates],
            "total_tokens": self.total_tokens,
            "budget_tokens": self.budget_tokens,
            "filter_mode": self.filter_mode,
            "degraded": self.degraded,
            "word_weight": None if self.word_weight is None else round(self.word_weight, 4),
            "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items()},
        }


def current_q(now: datetime) -> Q:
    """Memories that are in force at ``now``: not archived, already valid, not superseded, not expired."""
    return (
        Q(archived=False)
        & Q(valid_from__lte=now)
        & (Q(valid_to__isnull=True) | Q(valid_to__gt=now))
        & (Q(expires_at__isnull=True) | Q(expires_at__gt=now))
    )


def memories_in_force(*, user: Any, now: datetime | None = None) -> QuerySet[Memory]:
    """``user``'s own memories in force (``current_q``: not archived, already valid, not superseded, not
    expired), newest first: what the MCP's ``list_memories`` lists, as the admin's "in force" filter and the
    retriever see them."""
    at = now or timezone.now()
    return Memory.objects.filter(user=user).filter(current_q(at)).order_by("-occurred_at", "-pk")


# --- tier 2 ------------------------------------------------------------------------------------


@dataclass
class HybridCandidate:
    memory_id: int
    vector_rank: int | None = None
    text_rank: int | None = None
    similarity: float = 0.0  # cosine similarity to the query
    crowding: float = 0.0  # mean cosine to its HUB_K nearest fellow candidates (hubness; see HUB_WEIGHT)
    has_vector: bool = True  # a memory not embedded yet has no meaning to compare: the word arm found it
    # What fusion scored it on, for the report (cosine, crowding, word share), before a neighbour's share of
    # another candidate's score raised any of them; None where it was not measured.
    scored: tuple[float | None, float | None, float] | None = None
    text_share: float = 0.0  # idf-weighted share of the query's words the memory contains
    fused: float = 0.0


_CURRENT_SQL = (
    "NOT archived AND valid_from <= %(now)s AND (valid_to IS NULL OR valid_to > %(now)s) "
    "AND (expires_at IS NULL OR expires_at > %(now)s)"
)
# Not an episode of a turn the prompt still shows (params wsession, wfloor: see RecentWindow). COALESCE:
# a memory with no session or turn compares as NULL, and is kept.
_NOT_IN_WINDOW_SQL = (
    "NOT COALESCE(kind = 'episodic' AND source_session_id = %(wsession)s AND source_turn_id IN "
    "(SELECT w.id FROM chat_sessions_turn w WHERE w.session_id = %(wsession)s AND w.seq > %(wfloor)s), false)"
)


@dataclass(frozen=True)
class RecentWindow:
    """The turns of a chat session that its prompt shows (those numbered above ``after_seq``): their episodes
    are not sent to the model a second time as memories."""

    session_id: Any
    after_seq: int


def _window_params(window: RecentWindow | None) -> dict[str, Any]:
    return {"wsession": window.session_id if window else None, "wfloor": window.after_seq if window else 0}


# Every column but the vectors (not needed past the search; parsing 384 floats a row is not free).
_LIGHT_FIELDS = [f for f in Memory._meta.concrete_fields if f.name not in ("embedding", "search_vector")]
_LIGHT_COLUMNS = ", ".join(f.column for f in _LIGHT_FIELDS)
_LIGHT_ATTNAMES = [f.attname for f in _LIGHT_FIELDS]


def _light_memories(sql: str, params: dict[str, Any]) -> list[tuple[Memory, tuple[Any, ...]]]:
    """Run ``sql`` (its columns: ``_LIGHT_COLUMNS``, then any extras) and build each row's ``Memory`` (its
    vectors deferred), with the row's extra columns. ``Memory.objects.raw`` does the same at twice the cost
    per row; none of these fields converts its database value (checked in tests/memory)."""
    width = len(_LIGHT_ATTNAMES)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall()
    alias = connection.alias
    return [(Memory.from_db(alias, _LIGHT_ATTNAMES, row[:width]), row[width:]) for row in fetched]


# Two plans, chosen by the size of the user's history (counted up to the cap on the user index):
# - fewer than MEMORY_EXACT_SEARCH_MAX memories: exact search. Their rows come through the user index and
#   every distance is computed ("+ 0" keeps the HNSW index from taking the ORDER BY); a few hundred rows
#   cost about a millisecond, and recall is perfect.
# - more: the HNSW index (cosine) with pgvector 0.8's iterative scan (hnsw.iterative_scan = relaxed_order,
#   set per connection), so the user filter cannot starve the LIMIT. A filtered graph walk costs about
#   LIMIT / (the user's share of all rows) steps: cheap for big histories, slow for small ones.
# (One statement with both plans behind one-time filters was tried: the planner then prepared parallel
# workers for the exact plan of a big user, which cost more than this extra round trip.)
_HISTORY_SIZE_SQL = "SELECT count(*) FROM (SELECT 1 FROM memory_memory WHERE user_id = %(user)s LIMIT %(cap)s) capped"


def _nearest_sql(*, exact: bool, with_vector: bool = False) -> str:
    """The user's nearest memories: (id, distance[, embedding]). ``exact`` orders by an expression no index
    has, so every distance is computed (the plan for small histories); otherwise the ORDER BY can walk an
    HNSW index. ``with_vector`` carries the row's vector along (for the crowding: no second lookup)."""
    order = "(embedding <=> %(vector)s::vector) + 0" if exact else "embedding <=> %(vector)s::vector"
    columns = "id, embedding <=> %(vector)s::vector AS distance" + (", embedding" if with_vector else "")
    return f"""
SELECT {columns} FROM memory_memory
WHERE user_id = %(user)s AND kind <> 'procedural' AND embedding IS NOT NULL AND {_CURRENT_SQL}
  AND {_NOT_IN_WINDOW_SQL}
ORDER BY {order} LIMIT %(limit)s
"""


_VECTOR_SQL = _nearest_sql(exact=False)
_EXACT_VECTOR_SQL = _nearest_sql(exact=True)


def vector_literal(vector: list[float]) -> str:
    return "[" + ",".join(f"{v:.7g}" for v in vector) + "]"


# Users with an HNSW index of their own, as this process last read them (refreshed every minute). A
# user in it has a big history: no need to count it again on every query (the count walks up to the
# cap's worth of index entries). Stale for a minute at most, and harmlessly: a dropped index leaves the
# shared HNSW index, which answers the same query.
_OWN_INDEX_TTL = 60.0
_own_index_cache: tuple[float, frozenset[int]] = (0.0, frozenset())


def _users_with_own_index() -> frozenset[int]:
    global _own_index_cache
    read_at, users = _own_index_cache
    if time.monotonic() - read_at > _OWN_INDEX_TTL:
        users = frozenset(user_indexes_present())
        _own_index_cache = (time.monotonic(), users)
    return users


USER_INDEX_PREFIX = "memory_hnsw_user_"


def user_index_name(user_id: int) -> str:
    return f"{USER_INDEX_PREFIX}{int(user_id)}"


def user_indexes_present(*, valid: bool = True) -> dict[int, str]:
    """User id -> name of the per-user HNSW indexes that exist now (``valid=False``: those an interrupted
    build left unusable)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = 'memory_memory'::regclass AND i.indisvalid = %s AND c.relname LIKE %s",
            [valid, USER_INDEX_PREFIX + "%"],
        )
        names = [row[0] for row in cursor.fetchall()]
    return {int(name.removeprefix(USER_INDEX_PREFIX)): name for name in names}


def forget_user_indexes() -> None:
    """Read the per-user indexes again on next use (after creating or dropping some)."""
    global _own_index_cache
    _own_index_cache = (0.0, frozenset())


# The answer of ``_is_small_history`` per user, kept this long in the process: it only chooses the plan (an exact
# scan or the HNSW index; both give the right neighbours), and a user's history crosses the cap rarely, so a
# turn need not count it again (one statement a turn). Bounded: the oldest answers go first.
HISTORY_SIZE_TTL_SECONDS = 60.0
_HISTORY_SIZE_CACHE_MAX = 10_000
_history_size_cache: dict[tuple[int, int], tuple[float, bool]] = {}
_history_size_lock = threading.Lock()


def history_sizes_forget() -> None:
    """Forget the users' history sizes this process knows (tests; a bulk import that crossed the cap)."""
    with _history_size_lock:
        _history_size_cache.clear()


def _is_small_history(user_id: int) -> bool:
    """Fewer than MEMORY_EXACT_SEARCH_MAX memories (counted on the user index, up to the cap)? Answered again
    at most every ``HISTORY_SIZE_TTL_SECONDS`` per user and process."""
    if user_id in _users_with_own_index():
        return False
    cap = max(1, int(settings.MEMORY_EXACT_SEARCH_MAX))
    key, now = (user_id, cap), time.monotonic()
    with _history_size_lock:
        cached = _history_size_cache.get(key)
    if cached is not None and now - cached[0] < HISTORY_SIZE_TTL_SECONDS:
        return cached[1]
    with connection.cursor() as cursor:
        cursor.execute(_HISTORY_SIZE_SQL, {"user": user_id, "cap": cap})
        row = cursor.fetchone()
    small = row is not None and int(row[0]) < cap
    with _history_size_lock:
        if len(_history_size_cache) >= _HISTORY_SIZE_CACHE_MAX:
            for stale in sorted(_history_size_cache, key=lambda k: _history_size_cache[k][0])[
                : _HISTORY_SIZE_CACHE_MAX // 10
            ]:
                del _history_size_cache[stale]
        _history_size_cache[key] = (now, small)
    return small


def _vector_search(
    *,
    user_id: int,
    vector: list[float],
    now: datetime,
    limit: int,
    exact: bool | None = None,
    window: RecentWindow | None = None,
) -> list[tuple[int, float]]:
    """The user's ``limit`` nearest memories by cosine distance: exact for small histories, HNSW for big ones."""
    return _vector_arm(user_id=user_id, vector=vector, now=now, limit=limit, exact=exact, window=window).nearest


@dataclass
class VectorArm:
    """The vector arm's answer: the nearest memories (id, distance), best first; the distance of each word
    candidate (1.0 for one without a vector); the ids of every candidate that has a vector; and, when asked
    for, each candidate's crowding (hubness)."""

    nearest: list[tuple[int, float]]
    word_distance: dict[int, float]
    with_vector: set[int]
    crowding: dict[int, float]


def _vector_arm(
    *,
    user_id: int,
    vector: list[float],
    now: datetime,
    limit: int,
    exact: bool | None,
    also: list[tuple[int, float]] | None = None,
    also_limit: int = 0,
    window: RecentWindow | None = None,
    crowding_k: int = 0,
) -> VectorArm:
    """The nearest memories (as ``_vector_search``) and, in the same round trip, the distance of each word
    candidate in ``also`` ((id, share)) and, with ``crowding_k``, each candidate's crowding: its mean cosine
    to its ``crowding_k`` nearest fellow candidates. The fellows are the vector arm's rows and the word arm's
    best ``also_limit`` (share, then closeness to the query: the cut ``hybrid_candidates`` makes), at most
    HUB_FELLOWS of each, so neither the word arm's ties (up to TEXT_POOL rows when one word decides) nor
    large candidate settings make the pairs many. Candidates that are no fellows get no crowding."""
    if exact is None:
        exact = _is_small_history(user_id)
    words = also or []
    params: dict[str, Any] = {
        "user": user_id,
        "vector": vector_literal(vector),
        "now": now,
        "limit": limit,
        "also": [i for i, _ in words],
        "shares": [float(share) for _, share in words],
        "also_limit": min(also_limit, HUB_FELLOWS),
        "fellows": HUB_FELLOWS,
        "k": crowding_k,
        **_window_params(window),
    }
    nearest = _EXACT_VECTOR_SQL if exact else _VECTOR_SQL
    if crowding_k > 0:
        # Each candidate's vector is carried along from the row the arm read anyway (the table is not read
        # again; a vector stored out of line is still fetched from TOAST), and only the fellows' are sent
        # back, once each, in pgvector's binary form (vector_send: a 4-byte header, then big-endian float4s).
        # Their pairs are scored here, in one matrix product: in SQL, the pairs and their window sort cost
        # 2.3 ms a query (bench: LoCoMo users, ~80 fellows), here 0.1.
        nearest = _nearest_sql(exact=exact, with_vector=True)
        sql = f"""
            WITH pool AS MATERIALIZED (
                SELECT 0 AS arm, id, distance, NULL::float8 AS share, true AS has_vector, embedding
                FROM ({nearest}) nearest
                UNION ALL
                SELECT 1, m.id, COALESCE(m.embedding <=> %(vector)s::vector, 1.0), w.share,
                       m.embedding IS NOT NULL, m.embedding
                FROM unnest(%(also)s::bigint[], %(shares)s::float8[]) AS w(id, share)
                JOIN memory_memory m ON m.id = w.id WHERE m.user_id = %(user)s
            ),
            fellows AS MATERIALIZED (
                (SELECT id FROM pool WHERE arm = 0 ORDER BY distance, id LIMIT %(fellows)s)
                UNION (SELECT id FROM pool WHERE arm = 1 ORDER BY share DESC, distance, id LIMIT %(also_limit)s)
            )
            SELECT arm, id, distance, has_vector,
                   CASE WHEN id IN (SELECT id FROM fellows)
                             AND (arm = 0 OR id NOT IN (SELECT id FROM pool WHERE arm = 0))
                        THEN vector_send(embedding) END
            FROM pool
        """
    else:
        sql = f"""
            SELECT 0, id, distance, true, NULL FROM ({nearest}) nearest
            UNION ALL
            SELECT 1, m.id, COALESCE(m.embedding <=> %(vector)s::vector, 1.0), m.embedding IS NOT NULL, NULL
            FROM unnest(%(also)s::bigint[], %(shares)s::float8[]) AS w(id, share)
            JOIN memory_memory m ON m.id = w.id WHERE m.user_id = %(user)s
        """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    # relaxed_order may return neighbours slightly out of order: sort them by distance here.
    return VectorArm(
        nearest=sorted(((int(i), float(d)) for arm, i, d, _, _ in rows if arm == 0), key=lambda r: r[1]),
        word_distance={int(i): float(d) for arm, i, d, _, _ in rows if arm == 1},
        with_vector={int(i) for _, i, _, has_vector, _ in rows if has_vector},
        crowding=_crowding({int(i): bytes(raw) for _, i, _, _, raw in rows if raw is not None}, crowding_k),
    )


def _crowding(raw_vectors: dict[int, bytes], k: int) -> dict[int, float]:
    """Each fellow's mean cosine to its ``k`` nearest other fellows (fewer when there are fewer), from the
    vectors as pgvector's ``vector_send`` writes them. Cosine of the normalised vectors, as ``<=>`` measures
    it (1 - distance); a zero vector has cosine 0 to everything."""
    if len(raw_vectors) < 2 or k < 1:
        return {}
    ids = list(raw_vectors)
    matrix = np.frombuffer(b"".join(raw_vectors[i][4:] for i in ids), dtype=">f4").astype(np.float32)
    matrix = matrix.reshape(len(ids), -1)
    norms = np.linalg.norm(matrix, axis=1)
    matrix /= np.where(norms > 0, norms, 1.0)[:, None]
    sims = matrix @ matrix.T
    np.fill_diagonal(sims, -np.inf)
    take = min(k, len(ids) - 1)
    nearest = -np.partition(-sims, take - 1, axis=1)[:, :take]
    return dict(zip(ids, nearest.mean(axis=1).tolist(), strict=True))


def query_terms(query: str) -> list[str]:
    """Distinct words of the query, lower-cased, in order (safe to put into a tsquery)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        if len(word) > 1 or word.isdigit():
            seen.setdefault(word, None)
    return list(seen)[:32]


def word_candidates(
    *, user_id: int, query: str, now: datetime, limit: int | None = None, window: RecentWindow | None = None
) -> list[tuple[int, float]]:
    """Full-text candidates ranked by the idf-weighted share of query words they contain, best first:
    (id, share). Needs no query vector, so it runs while the query is being embedded.

    Returns the best ``limit`` and every row tied with the last of them (newer first):
    ``hybrid_candidates`` breaks those ties by closeness to the query once the query's vector is there.
    (Breaking them by recency here instead cost LoCoMo recall@10 0.714 -> 0.691; handing over at most four
    times ``limit``, 0.712.)

    Postgres' ts_rank has no inverse document frequency, so a word in every memory (a speaker's name,
    "user") would count as much as a rare one. The idf is estimated on this user's matching memories: the
    newest ``TEXT_POOL`` of them (streamed from the user index, so a huge history costs no more than that).
    """
    terms = query_terms(query)
    if not terms:
        return []
    limit = limit or settings.MEMORY_CANDIDATES
    hits = ", ".join(f"(search_vector @@ to_tsquery('english', %(t{i})s))::int AS h{i}" for i in range(len(terms)))
    # Per term: its idf over the pool, ln(1 + (n - df + 0.5) / (df + 0.5)), or 0 when no row has it (a stop
    # word in the 'english' config never matches); a row's share is its hits' idf over the total. Scored in
    # the database, so only the best rows travel, not the whole pool.
    idf = ", ".join(
        f"CASE WHEN sum(h{i}) > 0 THEN ln(1 + (count(*) - sum(h{i}) + 0.5)::float8 / (sum(h{i}) + 0.5)) "
        f"ELSE 0 END AS w{i}"
        for i in range(len(terms))
    )
    weight = " + ".join(f"h{i} * w{i}" for i in range(len(terms)))
    total = " + ".join(f"w{i}" for i in range(len(terms)))
    sql = f"""
        WITH pool AS MATERIALIZED (
            SELECT id, created_at, {hits}
            FROM memory_memory
            WHERE user_id = %(user)s AND kind <> 'procedural' AND {_CURRENT_SQL} AND {_NOT_IN_WINDOW_SQL}
              AND search_vector @@ to_tsquery('english', %(any)s)
            ORDER BY created_at DESC LIMIT %(pool)s  -- the newest matches: index memory_user_recent, streamed
        ), idf AS (SELECT {idf} FROM pool),
        scored AS MATERIALIZED (SELECT id, created_at, ({weight}) / COALESCE(NULLIF({total}, 0), 1.0) AS share
                                FROM pool, idf)
        SELECT id, share FROM scored
        WHERE share >= (SELECT share FROM scored ORDER BY share DESC OFFSET %(limit)s - 1 LIMIT 1)
           OR (SELECT count(*) FROM scored) <= %(limit)s
        ORDER BY share DESC, created_at DESC, id DESC
    """
    params: dict[str, Any] = {
        "user": user_id,
        "now": now,
        "any": " | ".join(terms),
        "pool": TEXT_POOL,
        "limit": limit,
        **_window_params(window),
        **{f"t{i}": term for i, term in enumerate(terms)},
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [(int(i), float(share)) for i, share in cursor.fetchall()]


@dataclass
class HybridSearch:
    """Tier 2's answer: the fused candidates, best first, and their rows (without the vectors)."""

    candidates: list[HybridCandidate]
    rows: dict[int, Memory]
    timings: dict[str, float]
    word_weight: float | None = None  # the word arm's share of the fused score for this query ("cc"; else None)


def hybrid_candidates(
    *,
    user: Any,
    query: str,
    vector: list[float] | None,
    now: datetime,
    limit: int | None = None,
    small: bool | None = None,
    words: list[tuple[int, float]] | None = None,
    window: RecentWindow | None = None,
) -> HybridSearch:
    """Vector and full-text candidates of one user, fused, best first, with their rows. ``small``
    (``_is_small_history``) and ``words`` (``word_candidates``) are what the caller has read already, while
    the query was being embedded.

    Fusion (FUSION): "cc", the default, is ``_convex_fusion`` (each arm's score on this query's own scale);
    "rrf" is reciprocal rank fusion (``VECTOR_WEIGHT / (RRF_K + vector rank) + TEXT_WEIGHT / (RRF_K + text
    rank)``), kept for comparison in bench/memory_eval.py."""
    limit = limit or settings.MEMORY_CANDIDATES
    timings: dict[str, float] = {}
    started = time.perf_counter()
    if words is None:
        words = word_candidates(user_id=user.pk, query=query, now=now, limit=limit, window=window)
        timings["text_search"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
    if small is None:
        small = _is_small_history(user.pk)
    # The vector arm asks for fewer rows from an HNSW index: with a filtered HNSW scan every extra row of a
    # big user's history costs graph steps, while full-text candidates are cheap (bench/memory_scale.py). An
    # exact search costs the same for any LIMIT.
    vector_limit = min(limit, settings.MEMORY_VECTOR_CANDIDATES)
    if not small:
        vector_limit = min(vector_limit, settings.MEMORY_HNSW_CANDIDATES)
    if vector is None:  # the query could not be embedded: the word arm alone, no meaning to compare
        arm = VectorArm(nearest=[], word_distance={}, with_vector=set(), crowding={})
    else:
        arm = _vector_arm(
            user_id=user.pk,
            vector=vector,
            now=now,
            limit=vector_limit,
            exact=small,
            also=words,
            also_limit=limit,
            window=window,
            crowding_k=HUB_K if HUB_WEIGHT and FUSION == "cc" else 0,
        )
        timings["exact_search" if small else "vector_search"] = (time.perf_counter() - started) * 1000
    # The word arm's ties at its cut go to the memories nearer the query.
    words = sorted(words, key=lambda w: (-w[1], arm.word_distance.get(w[0], 1.0), w[0]))[:limit]
    by_id: dict[int, HybridCandidate] = {}
    for rank, (memory_id, distance) in enumerate(arm.nearest, start=1):
        cand = by_id.setdefault(memory_id, HybridCandidate(memory_id))
        cand.vector_rank = rank
        cand.similarity = 1.0 - distance
    for rank, (memory_id, share) in enumerate(words, start=1):
        cand = by_id.setdefault(
            memory_id, HybridCandidate(memory_id, similarity=1.0 - arm.word_distance.get(memory_id, 1.0))
        )
        cand.text_rank = rank
        cand.text_share = share
    # A candidate with a vector that was no fellow (past HUB_FELLOWS) is neither discounted nor spared: it
    # gets the fellows' mean crowding.
    typical = statistics.fmean(arm.crowding.values()) if arm.crowding else 0.0
    for memory_id, cand in by_id.items():
        cand.has_vector = memory_id in arm.with_vector
        measured = arm.crowding.get(memory_id)
        cand.crowding = measured if measured is not None else typical
        cand.scored = (
            cand.similarity if cand.has_vector else None,
            measured if cand.has_vector else None,
            cand.text_share,
        )
    word_weight: float | None = None
    if FUSION == "cc":
        word_weight = _convex_fusion(list(by_id.values()))
    else:
        _rank_fusion(list(by_id.values()))
    started = time.perf_counter()
    rows = _neighbours_and_rows(user_id=user.pk, by_id=by_id, window=window)
    timings["neighbours_and_rows"] = (time.perf_counter() - started) * 1000
    # Only rows of this user that still exist (a candidate deleted meanwhile simply drops out).
    fused = sorted((c for c in by_id.values() if c.memory_id in rows), key=lambda c: (-c.fused, -c.similarity))
    return HybridSearch(candidates=fused, rows=rows, timings=timings, word_weight=word_weight)


def _rank_fusion(candidates: list[HybridCandidate]) -> None:
    """Reciprocal rank fusion: each arm adds its weight over RRF_K plus the candidate's rank in it."""
    for c in candidates:
        c.fused = (VECTOR_WEIGHT / (RRF_K + c.vector_rank) if c.vector_rank else 0.0) + (
            TEXT_WEIGHT / (RRF_K + c.text_rank) if c.text_rank else 0.0
        )


def word_trust(best_share: float) -> float:
    """How far the word arm is trusted on a query (0 to 1), from the idf-weighted share of the query's words
    that its best match has (see WORD_TRUST_FLOOR)."""
    if WORD_TRUST_FULL <= WORD_TRUST_FLOOR:
        return 1.0 if best_share > WORD_TRUST_FLOOR else 0.0
    return min(1.0, max(0.0, (best_share - WORD_TRUST_FLOOR) / (WORD_TRUST_FULL - WORD_TRUST_FLOOR)))


def _convex_fusion(candidates: list[HybridCandidate]) -> float:
    """Fused score as a convex combination of the two arms' scores, each on this query's own scale: the
    cosine, less HUB_WEIGHT times the candidate's crowding, between the worst and the best candidate's (every
    candidate with a vector has one: the word arm's are measured too; one without a vector scores 0 there),
    the word share as a part of the best. A memory passes the vector arm's best only where its words make
    up for more than the meaning it lacks.

    The word arm's weight is earned per query (``word_trust`` of the best word share, times 1 - VECTOR_SHARE):
    words that no memory has more than a sliver of leave the order to meaning. A query with no vector (the
    embedding failed) has only its words. Returns the word arm's weight."""
    sims = {c.memory_id: c.similarity - HUB_WEIGHT * c.crowding for c in candidates if c.has_vector}
    low, high = min(sims.values(), default=0.0), max(sims.values(), default=0.0)
    share_high = max((c.text_share for c in candidates), default=0.0)
    word_weight = (1.0 - VECTOR_SHARE) * (word_trust(share_high) if sims else 1.0)
    for c in candidates:
        sim = sims.get(c.memory_id)
        if sim is None:
            meaning = 0.0  # no vector: it competes on its words alone
        else:
            meaning = (sim - low) / (high - low) if high > low else 1.0
        wording = c.text_share / share_high if share_high > 0 else 0.0
        c.fused = (1.0 - word_weight) * meaning + word_weight * wording
    return word_weight


# The neighbours of the best candidates (the episodes just before and after each in its own chat session,
# within NEIGHBOUR_MAX_GAP), then the rows of every candidate and neighbour.
_NEIGHBOUR_SQL = """(SELECT {a}.id FROM memory_memory {a}
                 WHERE {a}.source_session_id = c.source_session_id AND {a}.kind = 'episodic' AND NOT {a}.archived
                   AND {a}.user_id = c.user_id AND {a}.occurred_at {op} c.occurred_at
                   AND {a}.occurred_at {within} c.occurred_at {sign} %(gap)s AND {a}.id <> c.id
                   AND NOT COALESCE({a}.source_turn_id IN (SELECT w.id FROM chat_sessions_turn w
                                    WHERE w.session_id = %(wsession)s AND w.seq > %(wfloor)s), false)
                 ORDER BY {a}.occurred_at {order} LIMIT 1)"""
_NEIGHBOURS_AND_ROWS_SQL = f"""
        WITH src AS MATERIALIZED (
            SELECT c.id,
              {_NEIGHBOUR_SQL.format(a="p", op="<", within=">=", sign="-", order="DESC")} AS before_id,
              {_NEIGHBOUR_SQL.format(a="n", op=">", within="<=", sign="+", order="ASC")} AS after_id
            FROM memory_memory c
            WHERE c.id = ANY(%(sources)s::bigint[]) AND c.user_id = %(user)s AND c.kind = 'episodic'
              AND c.source_session_id IS NOT NULL
        ), wanted AS (
            SELECT unnest(%(ids)s::bigint[]) AS id UNION SELECT before_id FROM src UNION SELECT after_id FROM src
        )
        SELECT {", ".join(f"m.{f.column}" for f in _LIGHT_FIELDS)}, src.before_id, src.after_id
        FROM memory_memory m LEFT JOIN src ON src.id = m.id
        WHERE m.user_id = %(user)s AND m.id IN (SELECT id FROM wanted)
"""


def _neighbours_and_rows(
    *, user_id: int, by_id: dict[int, HybridCandidate], window: RecentWindow | None = None
) -> dict[int, Memory]:
    """Load the rows of every candidate (vectors left out), and give the episodes just before and after a
    strong candidate part of its score: one round trip.

    A conversation's answer often sits in the turn next to the one that matches the words ("Yes, in
    Paris!" after "Where did you go?"): neighbours of the best candidates become candidates themselves.
    Only where the neighbours are real: episodes of the same chat session, close in time. Rows written one
    after another (an import, the API) are not a conversation, and have no neighbours.
    """
    if not by_id:
        return {}
    top = sorted(by_id.values(), key=lambda c: -c.fused)[:NEIGHBOUR_SOURCES] if NEIGHBOUR_WEIGHT else []
    params = {
        "sources": [c.memory_id for c in top],
        "ids": list(by_id),
        "user": user_id,
        "gap": NEIGHBOUR_MAX_GAP,
        **_window_params(window),
    }
    rows: dict[int, Memory] = {}
    links: dict[int, tuple[Any, ...]] = {}
    for memory, (before_id, after_id) in _light_memories(_NEIGHBOURS_AND_ROWS_SQL, params):
        rows[memory.id] = memory
        links[memory.id] = (before_id, after_id)
    for parent in top:
        if parent.memory_id not in rows:
            continue
        for neighbour in links[parent.memory_id]:
            if neighbour is None or neighbour not in rows:
                continue
            cand = by_id.setdefault(neighbour, HybridCandidate(neighbour))
            cand.fused += NEIGHBOUR_WEIGHT * parent.fused
            cand.similarity = max(cand.similarity, NEIGHBOUR_WEIGHT * parent.similarity)
            cand.text_share = max(cand.text_share, NEIGHBOUR_WEIGHT * parent.text_share)
    return rows


# --- tier 3 ------------------------------------------------------------------------------------

RELEVANCE_SYSTEM_PROMPT = (
    "You judge which stored memories help answer the user's message. Score every memory id from 0.0 "
    "(unrelated) to 1.0 (needed to answer). Facts about the user that the reply should respect count as "
    "relevant. Return one score per id and nothing else."
)


def _cheap_structured(
    *,
    agent: Agent | None,
    messages: list[dict[str, Any]],
    schema: type[SchemaT],
    purpose: Purpose,
    max_tokens: int,
    timeout: float,
) -> SchemaT:
    """One structured call to the cheap model, abandoned past ``timeout`` seconds (raises
    ``concurrent.futures.TimeoutError``; any provider error is raised too)."""
    provider = get_provider(agent=agent, cheap=True)
    ctx = CallContext(purpose=purpose, agent_id=agent.pk if agent else None)

    # The call runs in a worker thread (so it can be abandoned past its time budget) and writes its
    # LLMCall record there. Outside a transaction the thread uses (and closes) its own connection; inside
    # one (a caller's atomic block, or a test) it borrows the caller's, so the record belongs to the same
    # transaction instead of being committed on the side.
    caller = connections[DEFAULT_DB_ALIAS]
    shared = caller if caller.in_atomic_block else None
    if shared is not None:
        shared.inc_thread_sharing()

    def call() -> SchemaT:
        try:
            if shared is not None:
                connections[DEFAULT_DB_ALIAS] = shared
            return provider.structured(messages, schema=schema, ctx=ctx, max_tokens=max_tokens)
        finally:
            if shared is not None:
                shared.dec_thread_sharing()
            else:
                connection.close()

    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=purpose)
    try:
        return executor.submit(call).result(timeout=timeout)
    finally:
        executor.shutdown(wait=False)


def _model_scores(*, agent: Agent | None, query: str, memories: list[Memory], timeout: float) -> dict[int, float]:
    """One batched cheap-model call scoring all candidates; raises on error or when over the time budget."""
    listing = "\n".join(f"[{m.id}] {m.text[:MODEL_FILTER_CHARS]}" for m in memories)
    messages = [
        {"role": "system", "content": RELEVANCE_SYSTEM_PROMPT},
        {"role": "user", "content": f"User message:\n{query}\n\nMemories:\n{listing}"},
    ]
    result = _cheap_structured(
        agent=agent,
        messages=messages,
        schema=RelevanceScores,
        purpose="relevance",
        max_tokens=20 + 12 * len(memories),
        timeout=timeout,
    )
    wanted = {m.id for m in memories}
    return {s.id: s.score for s in result.scores if s.id in wanted}


# --- the query -----------------------------------------------------------------------------------

QUERY_CONTEXT_TURNS = 2  # the user's earlier messages searched with the new one
QUERY_CONTEXT_CHARS = 600  # at most this much of them
QUERY_STANDALONE_WORDS = 6  # a message with this many words is searched alone (a shorter one is a follow-up)
QUERY_REWRITE_PROMPT = (
    "Rewrite the user's newest message as one standalone search query for their stored memories: resolve "
    "what 'it', 'there', 'that' and the like refer to from their earlier messages, keep names, places, dates "
    "and the topic, drop greetings. Answer with the query only, in the user's language."
)


@dataclass(frozen=True)
class RetrievalQuery:
    text: str
    source: str  # "message" (the message alone), "conversation" (with earlier messages), "rewrite" (cheap model)


def retrieval_query(*, message: str, earlier: list[str], agent: Agent | None = None) -> RetrievalQuery:
    """What to search the memories for: the new message, with the user's ``earlier`` messages (oldest
    first) so a follow-up ("and when was that?") still finds its topic; rewritten by the cheap model into
    a standalone query when one is configured (one short call, within MEMORY_RELEVANCE_TIMEOUT; any
    failure keeps the message with its context). Without a cheap model, a short message (a follow-up, under
    QUERY_STANDALONE_WORDS words) is searched with its context, the message first; a longer one alone."""
    context = [t.strip() for t in earlier if t.strip()][-QUERY_CONTEXT_TURNS:]
    if not context:
        return RetrievalQuery(message, "message")
    joined = " ".join(context)[-QUERY_CONTEXT_CHARS:]
    if _cheap_model_configured(agent):
        listing = "\n".join(f"- {t[:QUERY_CONTEXT_CHARS]}" for t in context)
        messages = [
            {"role": "system", "content": QUERY_REWRITE_PROMPT},
            {"role": "user", "content": f"Earlier messages:\n{listing}\n\nNewest message:\n{message}"},
        ]
        try:
            rewritten = _cheap_structured(
                agent=agent,
                messages=messages,
                schema=SearchQuery,
                purpose="query",
                max_tokens=80,
                timeout=float(settings.MEMORY_RELEVANCE_TIMEOUT),
            ).query.strip()
            if rewritten:
                return RetrievalQuery(rewritten, "rewrite")
        except Exception as exc:  # noqa: BLE001 - the rewrite is an aid: any failure keeps the plain query
            logger.warning("query rewrite failed; searching the message with its context: %s", exc)
    elif len(query_terms(message)) >= QUERY_STANDALONE_WORDS:
        # Without a model, a message of a sentence or more stands on its own: the earlier ones only blur it
        # (bench/memory_eval.py's conversational corpus lost recall@10 with them added to every query).
        return RetrievalQuery(message, "message")
    return RetrievalQuery(f"{message}\n{joined}", "conversation")


def _cheap_model_configured(agent: Agent | None) -> bool:
    """A cheap model is named for the agent's endpoint (``LLM_CHEAP_MODEL`` or the profile's ``cheap_model``):
    the query rewrite is one more call before the reply, worth it only on a fast, cheap model."""
    try:
        profile = agent_profile(agent)
    except Exception:  # noqa: BLE001 - a misconfigured endpoint is reported by the turn's own provider lookup
        return False
    return profile is not None and bool(profile.cheap_model)


def _model_filter_available(agent: Agent | None) -> bool:
    return not get_provider(agent=agent, cheap=True).is_demo


# --- procedures ---------------------------------------------------------------------------------


def trigger_matches(trigger: str, query: str) -> bool:
    """A trigger is phrases separated by commas or '|'; one phrase found as whole words matches.
    An empty trigger always matches (a standing instruction for the agent or workflow)."""
    phrases = [p.strip().lower() for p in re.split(r"[,|]", trigger) if p.strip()]
    if not phrases:
        return True
    text = " ".join(_WORD.findall(query.lower()))
    return any(re.search(rf"\b{re.escape(' '.join(_WORD.findall(p)))}\b", text) for p in phrases if _WORD.search(p))


# --- the selector --------------------------------------------------------------------------------


def prompt_text(memory: Memory) -> str:
    """A memory as it is shown to the model: episodes and facts carry the date they happened (or were
    learned), so "when" questions can be answered and old news told from new."""
    if memory.kind == Memory.Kind.PROCEDURAL:
        return memory.text
    return f"({memory.occurred_at:%Y-%m-%d}) {memory.text}"


def _recency(memory: Memory, now: datetime) -> float:
    age_days = max(0.0, (now - memory.occurred_at).total_seconds() / 86400)
    return 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)


PROCEDURE = "procedure"  # the reason label of procedures in the combined tier-1 query
_TIER1_REASONS = ("profile fact", "pinned", "recent action", PROCEDURE)
# Tier 1 in one round trip: four short lookups, each on its own index, each numbered in its own order.
# (Hand-written: the same query through the ORM took longer to compile than to run.)
_TIER1_SQL = f"""
(SELECT {_LIGHT_COLUMNS}, 0 AS lookup_branch, row_number() OVER (ORDER BY fact_key, valid_from DESC) AS lookup_rank
   FROM memory_memory WHERE user_id = %(user)s AND {_CURRENT_SQL}
    AND kind = 'semantic' AND valid_to IS NULL AND fact_key <> ''
   ORDER BY fact_key, valid_from DESC LIMIT %(profile)s)  -- index memory_user_profile
UNION ALL
(SELECT {_LIGHT_COLUMNS}, 1, row_number() OVER (ORDER BY importance DESC, id)
   FROM memory_memory WHERE user_id = %(user)s AND {_CURRENT_SQL} AND pinned AND kind <> 'procedural'
   ORDER BY importance DESC, id LIMIT %(pinned)s)  -- index memory_user_pinned
UNION ALL
(SELECT {_LIGHT_COLUMNS}, 2, row_number() OVER (ORDER BY created_at DESC, id DESC)
   FROM memory_memory WHERE user_id = %(user)s AND {_CURRENT_SQL} AND kind = 'episodic'
    AND source_turn_id IS NOT NULL AND {_NOT_IN_WINDOW_SQL}
   ORDER BY created_at DESC, id DESC LIMIT %(recent)s)  -- index memory_user_recent_actions
UNION ALL
(SELECT {_LIGHT_COLUMNS}, 3, row_number() OVER (ORDER BY pinned DESC, importance DESC, id)
   FROM memory_memory WHERE (user_id = %(user)s OR user_id IS NULL) AND {_CURRENT_SQL} AND kind = 'procedural'
    AND (agent_id IS NULL OR agent_id = %(agent)s) AND (workflow = '' OR workflow = %(workflow)s)
   ORDER BY pinned DESC, importance DESC, id LIMIT %(procedures)s)
"""


def _exact_lookups(
    *, user: Any, now: datetime, agent: Agent | None = None, workflow: str = "", window: RecentWindow | None = None
) -> dict[str, list[Memory]]:
    """Tier 1's lookups of one user and the candidate procedures (trigger not checked yet), by reason.

    Recent actions are the episodes of the user's latest turns with an agent (those the prompt does not
    show already): what they were doing last time. Episodes written through the API or an import are
    records, not recent actions; they compete on relevance like any other memory."""
    params = {
        **_window_params(window),
        "user": user.pk,
        "now": now,
        "agent": agent.pk if agent else None,
        "workflow": workflow,
        "profile": PROFILE_LIMIT,
        "pinned": PINNED_LIMIT,
        "recent": int(settings.MEMORY_RECENT_ACTIONS),
        "procedures": 50,
    }
    # Each row carries its lookup (branch) and its place in that lookup's order (rank).
    rows = _light_memories(_TIER1_SQL, params)
    grouped: dict[str, list[Memory]] = {reason: [] for reason in _TIER1_REASONS}
    for memory, (branch, _rank) in sorted(rows, key=lambda r: r[1]):
        grouped[_TIER1_REASONS[branch]].append(memory)
    return grouped


def _tier1_from(grouped: dict[str, list[Memory]]) -> list[tuple[Memory, str]]:
    tier1: list[tuple[Memory, str]] = []
    seen: set[int] = set()
    for reason, memories in grouped.items():
        if reason == PROCEDURE:
            continue
        for memory in memories:
            if memory.id not in seen:
                tier1.append((memory, reason))
                seen.add(memory.id)
    return tier1


def memories_for_prompt(
    *,
    user: Any,
    query: str,
    agent: Agent | None = None,
    workflow: str = "",
    budget_tokens: int,
    relevance_threshold: float | None = None,
    use_model_filter: bool = True,
    now: datetime | None = None,
    query_vector: list[float] | None = None,
    touch: bool = True,
    window: RecentWindow | None = None,
) -> RetrievedMemories:
    """The memories of ``user`` worth putting into a prompt about ``query``, ranked and cut to
    ``budget_tokens``, with a report of every candidate (each memory once) and why it was kept or dropped.

    Only ``user``'s own current memories are considered (plus shared procedures); episodes of the turns in
    ``window`` (the prompt shows those turns already) are left out. The relevance filter is the cheap
    model's batched scores when one is configured (kept from ``relevance_threshold``, 0.5 when None), else
    the calibrated default (None: the fused score as a part of the query's best, kept from RELATIVE_KEEP)
    or an absolute cut-off on the stronger of cosine and word share (a number: an operator's choice; 0
    keeps everything). Accessed memories get their access
    count and last access time updated, unless ``touch`` is false: the runtime leaves that to the turn's
    memory-write task, off the request path (``memory.services.turn_memories_write``). ``query_vector``
    skips embedding the query (when the caller has it already).
    """
    started_total = time.perf_counter()
    now = now or timezone.now()
    result = RetrievedMemories(budget_tokens=budget_tokens, query=query)
    timings = result.timings_ms
    if user is None or not getattr(user, "pk", None):
        return result
    counter = counter_for((agent.model if agent else "") or settings.LLM_MODEL or "")

    # The query's vector is computed on another thread while tier 1, the size of the history and the word
    # arm of tier 2 are read here (the model and the database both let go of the GIL): the embedding is
    # the longest step, and only the vector arm and the candidates' rows wait for it.
    started = time.perf_counter()
    pending: concurrent.futures.Future[list[float]] | None = None  # no vector for a blank query
    if query_vector is not None:
        pending = concurrent.futures.Future()
        pending.set_result(query_vector)
    elif query.strip():
        pending = embed_query_soon(query)

    # Tier 1: exact lookups.
    # Profile facts, pinned memories, recent actions and the candidate procedures: one query.
    grouped = _exact_lookups(user=user, now=now, agent=agent, workflow=workflow, window=window)
    tier1 = _tier1_from(grouped)
    seen = {memory.id for memory, _ in tier1}
    result.procedural = [m for m in grouped[PROCEDURE] if trigger_matches(m.trigger, query)]
    timings["tier1"] = (time.perf_counter() - started) * 1000

    # Tier 2: hybrid candidates.
    fused: list[HybridCandidate] = []
    loaded: dict[int, Memory] = {}
    if pending is not None:
        started = time.perf_counter()
        small = _is_small_history(user.pk)
        timings["history_size"] = (time.perf_counter() - started) * 1000
        words = word_candidates(user_id=user.pk, query=query, now=now, window=window)
        tier2_ms = (time.perf_counter() - started) * 1000
        timings["text_search"] = tier2_ms - timings["history_size"]
        started = time.perf_counter()
        # Bounded: an embedding endpoint times out by itself (EMBEDDING_TIMEOUT), and a batch may wait behind one.
        # A query that cannot be embedded is searched by its words alone, and the report says so.
        vector: list[float] | None
        try:
            vector = pending.result(timeout=2 * float(settings.EMBEDDING_TIMEOUT))
        except Exception as exc:  # noqa: BLE001 - retrieval degrades to the word arm, never fails for this
            logger.warning("query embedding failed (%s): searching by words alone", type(exc).__name__)
            vector, result.degraded = None, f"words only: the query could not be embedded ({type(exc).__name__})"
        timings["embed_wait"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        search = hybrid_candidates(
            user=user, query=query, vector=vector, now=now, small=small, words=words, window=window
        )
        fused, loaded = search.candidates, search.rows
        result.word_weight = search.word_weight
        timings.update(search.timings)
        timings["tier2"] = tier2_ms + (time.perf_counter() - started) * 1000  # without the wait for the vector

    # Tier 3: relevance filter.
    started = time.perf_counter()
    fresh = [c for c in fused if c.memory_id not in seen]
    scores: dict[int, float] = {}
    fallback = "calibrated" if relevance_threshold is None else "threshold"
    mode = fallback
    if use_model_filter and fresh:
        try:
            if _model_filter_available(agent):
                scores = _model_scores(
                    agent=agent,
                    query=query,
                    memories=[loaded[c.memory_id] for c in fresh],
                    timeout=float(settings.MEMORY_RELEVANCE_TIMEOUT),
                )
                mode = "model"
        except concurrent.futures.TimeoutError:
            mode = f"{fallback} (model failed: no answer within {settings.MEMORY_RELEVANCE_TIMEOUT:g}s)"
        except Exception as exc:  # noqa: BLE001 - any provider failure must fall back, never break the turn
            # The report reaches the user (memory panel, API): the kind of failure only; its text is logged.
            mode = f"{fallback} (model failed: {type(exc).__name__})"
            logger.warning("relevance filter fell back to the %s filter: %s", fallback, exc)
    result.filter_mode = mode
    timings["filter"] = (time.perf_counter() - started) * 1000

    # Tier 4: rank and cut to the budget.
    started = time.perf_counter()
    best_fused = max((c.fused for c in fresh), default=1.0) or 1.0
    if mode == "model":
        cut_off, source = (0.5 if relevance_threshold is None else relevance_threshold), "model"
    elif relevance_threshold is None:
        cut_off, source = RELATIVE_KEEP, "calibrated"
    else:
        cut_off, source = relevance_threshold, "threshold"
    ranked: list[tuple[float, HybridCandidate, float, CandidateReport]] = []
    reports: list[CandidateReport] = []
    tier1_reports: dict[int, CandidateReport] = {}
    for memory, reason in tier1:
        report = CandidateReport(
            id=memory.id, kind=memory.kind, preview=memory.text[:PREVIEW_CHARS], tier=1, reason=reason
        )
        tier1_reports[memory.id] = report
        reports.append(report)
    for cand in fused:
        if cand.memory_id in tier1_reports:
            # Each memory is reported once: tier 1's entry, with what tier 2 found too.
            tier1_reports[cand.memory_id].scored_by(cand)
            continue
        memory = loaded[cand.memory_id]
        report = CandidateReport(id=memory.id, kind=memory.kind, preview=memory.text[:PREVIEW_CHARS], tier=2)
        report.scored_by(cand)
        if mode == "model":
            relevance = scores.get(cand.memory_id, 0.0)
            base_score = relevance
        elif relevance_threshold is None:
            # Calibrated: the fused score, already on this query's own scale, as a part of its best's.
            relevance = cand.fused / best_fused
            base_score = cand.fused / best_fused
        else:
            # An operator's absolute cut-off: the stronger of meaning (cosine) and wording (word share).
            relevance = max(cand.similarity, cand.text_share)
            base_score = cand.fused / best_fused
        report.relevance = relevance
        reports.append(report)
        if relevance < cut_off:
            report.reason = f"below the {source} relevance cut-off {cut_off:.2f}"
            continue
        score = (
            WEIGHT_RELEVANCE * base_score
            + WEIGHT_IMPORTANCE * memory.importance
            + WEIGHT_RECENCY * _recency(memory, now)
        )
        ranked.append((score, cand, relevance, report))
    ranked.sort(key=lambda r: -r[0])

    # A recent action is kept (what the user was doing last time) but is not "needed to answer": it gets the
    # rank score a tier-2 candidate would (its fused score on this query's scale, importance, recency) and its
    # place among the relevant ones by that score, not 1.0 and first. Profile facts and pinned ones stay 1.0.
    fused_of = {c.memory_id: c.fused for c in fused}
    used = 0
    for memory, reason in tier1:
        text = prompt_text(memory)
        tokens = counter.count(text)
        report = tier1_reports[memory.id]
        if used + tokens > budget_tokens:
            report.reason += "; over the memory budget"
            continue
        used += tokens
        report.kept = True
        score = 1.0
        if reason == "recent action":
            score = (
                WEIGHT_RELEVANCE * min(1.0, fused_of.get(memory.id, 0.0) / best_fused)
                + WEIGHT_IMPORTANCE * memory.importance
                + WEIGHT_RECENCY * _recency(memory, now)
            )
        result.items.append(RetrievedMemory(memory=memory, text=text, score=score, tier=1, tokens=tokens))
    most = int(settings.MEMORY_MAX_KEPT)
    for score, cand, relevance, report in ranked:
        memory = loaded[cand.memory_id]
        if len(result.items) >= most:
            report.reason = f"relevant ({relevance:.2f}) but past the {most} memories a prompt takes"
            continue
        text = prompt_text(memory)
        tokens = counter.count(text)
        if used + tokens > budget_tokens:
            report.reason = f"relevant ({relevance:.2f}) but over the memory budget"
            continue
        used += tokens
        report.kept = True
        report.reason = f"relevant ({source} {relevance:.2f}), rank score {score:.3f}"
        result.items.append(RetrievedMemory(memory=memory, text=text, score=score, tier=2, tokens=tokens))
    # Profile facts and pinned memories first (1.0), then the relevant ones and the recent actions by score.
    result.items.sort(key=lambda item: (item.score < 1.0, -item.score))
    result.candidates = reports
    result.total_tokens = used
    timings["rank"] = (time.perf_counter() - started) * 1000

    if touch:
        _touch([i.memory.id for i in result.items], now)
    timings["total"] = (time.perf_counter() - started_total) * 1000
    return result


def _touch(ids: list[int], now: datetime) -> None:
    memories_touch(memory_ids=ids, now=now)


def memory_search(*, user: Any, query: str, limit: int = 20, now: datetime | None = None) -> list[Memory]:
    """Hybrid (vector + full-text) search over one user's current memories, best first (tier 2 alone, no
    ranking or budget). The admin's ``~`` search is plain cosine over its filtered list; this is for code
    that wants the hybrid order without a prompt budget."""
    now = now or timezone.now()
    if user is None or not getattr(user, "pk", None) or not query.strip():
        return []
    vector = get_embedder().embed_query(query)
    search = hybrid_candidates(user=user, query=query, vector=vector, now=now, limit=limit)
    return [search.rows[c.memory_id] for c in search.candidates][:limit]
