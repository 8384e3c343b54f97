"""The vector arm of tier 2: the user's nearest memories by cosine distance, the distance of each word
candidate, and each candidate's crowding (hubness), in one round trip.

Two plans, chosen by the size of the user's history (counted up to the cap on the user index):
- fewer than MEMORY_EXACT_SEARCH_MAX memories: exact search. Their rows come through the user index and
  every distance is computed ("+ 0" keeps the HNSW index from taking the ORDER BY); a few hundred rows
  cost about a millisecond, and recall is perfect.
- more: the HNSW index (cosine) with pgvector 0.8's iterative scan (hnsw.iterative_scan = relaxed_order,
  set per connection), so the user filter cannot starve the LIMIT. A filtered graph walk costs about
  LIMIT / (the user's share of all rows) steps: cheap for big histories, slow for small ones.
(One statement with both plans behind one-time filters was tried: the planner then prepared parallel
workers for the exact plan of a big user, which cost more than this extra round trip.)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection

from memory.retrieval import tuning
from memory.retrieval.cache import UserCache
from memory.retrieval.sql import CURRENT_SQL, NOT_IN_WINDOW_SQL, RecentWindow, window_params
from memory.selectors import users_with_own_index

_HISTORY_SIZE_SQL = "SELECT count(*) FROM (SELECT 1 FROM memory_memory WHERE user_id = %(user)s LIMIT %(cap)s) capped"


def _nearest_sql(*, exact: bool, with_vector: bool = False) -> str:
    """The user's nearest memories: (id, distance[, embedding]). ``exact`` orders by an expression no index
    has, so every distance is computed (the plan for small histories); otherwise the ORDER BY can walk an
    HNSW index. ``with_vector`` carries the row's vector along (for the crowding: no second lookup)."""
    order = "(embedding <=> %(vector)s::vector) + 0" if exact else "embedding <=> %(vector)s::vector"
    columns = "id, embedding <=> %(vector)s::vector AS distance" + (", embedding" if with_vector else "")
    return f"""
SELECT {columns} FROM memory_memory
WHERE user_id = %(user)s AND kind <> 'procedural' AND embedding IS NOT NULL AND {CURRENT_SQL}
  AND {NOT_IN_WINDOW_SQL}
ORDER BY {order} LIMIT %(limit)s
"""


_VECTOR_SQL = _nearest_sql(exact=False)
_EXACT_VECTOR_SQL = _nearest_sql(exact=True)


def vector_literal(vector: list[float]) -> str:
    return "[" + ",".join(f"{v:.7g}" for v in vector) + "]"


# The answer of ``is_small_history`` per user, kept this long in the process: it only chooses the plan (an exact
# scan or the HNSW index; both give the right neighbours), and a user's history crosses the cap rarely, so a
# turn need not count it again (one statement a turn).
HISTORY_SIZE_TTL_SECONDS = 60.0
_history_sizes: UserCache[bool] = UserCache(ttl_seconds=HISTORY_SIZE_TTL_SECONDS)


def history_sizes_forget() -> None:
    """Forget the users' history sizes this process knows (tests; a bulk import that crossed the cap)."""
    _history_sizes.clear()


def is_small_history(user_id: int) -> bool:
    """Fewer than MEMORY_EXACT_SEARCH_MAX memories (counted on the user index, up to the cap)? Answered again
    at most every ``HISTORY_SIZE_TTL_SECONDS`` per user and process."""
    if user_id in users_with_own_index():
        return False
    cap = max(1, int(settings.MEMORY_EXACT_SEARCH_MAX))
    key = (user_id, cap)
    cached = _history_sizes.get(key)
    if cached is not None:
        return cached
    with connection.cursor() as cursor:
        cursor.execute(_HISTORY_SIZE_SQL, {"user": user_id, "cap": cap})
        row = cursor.fetchone()
    small = row is not None and int(row[0]) < cap
    _history_sizes.put(key, small)
    return small


def vector_search(
    *,
    user_id: int,
    vector: list[float],
    now: datetime,
    limit: int,
    exact: bool | None = None,
    window: RecentWindow | None = None,
) -> list[tuple[int, float]]:
    """The user's ``limit`` nearest memories by cosine distance: exact for small histories, HNSW for big ones."""
    return vector_arm(user_id=user_id, vector=vector, now=now, limit=limit, exact=exact, window=window).nearest


@dataclass
class VectorArm:
    """The vector arm's answer: the nearest memories (id, distance), best first; the distance of each word
    candidate (1.0 for one without a vector); the ids of every candidate that has a vector; and, when asked
    for, each candidate's crowding (hubness)."""

    nearest: list[tuple[int, float]]
    word_distance: dict[int, float]
    with_vector: set[int]
    crowding: dict[int, float]


def _pooled_sql(nearest: str) -> str:
    """The nearest memories and the word candidates, each with its vector; only the fellows' vectors are sent
    back.

    Each candidate's vector is carried along from the row the arm read anyway (the table is not read
    again; a vector stored out of line is still fetched from TOAST), and only the fellows' are sent
    back, once each, in pgvector's binary form (vector_send: a 4-byte header, then big-endian float4s).
    Their pairs are scored here, in one matrix product: in SQL, the pairs and their window sort cost
    2.3 ms a query (bench: LoCoMo users, ~80 fellows), here 0.1."""
    return f"""
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


def _plain_sql(nearest: str) -> str:
    """The nearest memories and the word candidates' distances, no vectors (no crowding asked for)."""
    return f"""
            SELECT 0, id, distance, true, NULL FROM ({nearest}) nearest
            UNION ALL
            SELECT 1, m.id, COALESCE(m.embedding <=> %(vector)s::vector, 1.0), m.embedding IS NOT NULL, NULL
            FROM unnest(%(also)s::bigint[], %(shares)s::float8[]) AS w(id, share)
            JOIN memory_memory m ON m.id = w.id WHERE m.user_id = %(user)s
        """


def vector_arm(
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
    """The nearest memories (as ``vector_search``) and, in the same round trip, the distance of each word
    candidate in ``also`` ((id, share)) and, with ``crowding_k``, each candidate's crowding: its mean cosine
    to its ``crowding_k`` nearest fellow candidates. The fellows are the vector arm's rows and the word arm's
    best ``also_limit`` (share, then closeness to the query: the cut ``hybrid_candidates`` makes), at most
    HUB_FELLOWS of each, so neither the word arm's ties (up to TEXT_POOL rows when one word decides) nor
    large candidate settings make the pairs many. Candidates that are no fellows get no crowding."""
    if exact is None:
        exact = is_small_history(user_id)
    words = also or []
    params: dict[str, Any] = {
        "user": user_id,
        "vector": vector_literal(vector),
        "now": now,
        "limit": limit,
        "also": [i for i, _ in words],
        "shares": [float(share) for _, share in words],
        "also_limit": min(also_limit, tuning.HUB_FELLOWS),
        "fellows": tuning.HUB_FELLOWS,
        "k": crowding_k,
        **window_params(window),
    }
    if crowding_k > 0:
        sql = _pooled_sql(_nearest_sql(exact=exact, with_vector=True))
    else:
        sql = _plain_sql(_EXACT_VECTOR_SQL if exact else _VECTOR_SQL)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    # relaxed_order may return neighbours slightly out of order: sort them by distance here.
    return VectorArm(
        nearest=sorted(((int(i), float(d)) for arm, i, d, _, _ in rows if arm == 0), key=lambda r: r[1]),
        word_distance={int(i): float(d) for arm, i, d, _, _ in rows if arm == 1},
        with_vector={int(i) for _, i, _, has_vector, _ in rows if has_vector},
        crowding=crowding({int(i): bytes(raw) for _, i, _, _, raw in rows if raw is not None}, crowding_k),
    )


def crowding(raw_vectors: dict[int, bytes], k: int) -> dict[int, float]:
    """Each fellow's mean cosine to its ``k`` nearest other fellows (fewer when there are fewer), from the
    vectors as pgvector's ``vector_send`` writes them."""
    if len(raw_vectors) < 2 or k < 1:
        return {}
    ids = list(raw_vectors)
    return dict(zip(ids, nearest_mean_cosines([raw_vectors[i] for i in ids], k).tolist(), strict=True))


def nearest_mean_cosines(raw_vectors: list[bytes], k: int) -> np.ndarray:
    """Each vector's mean cosine to its ``k`` nearest others (fewer when there are fewer; at least two
    vectors), from pgvector's ``vector_send`` form (a 4-byte header, then big-endian float4s). Cosine of the
    normalised vectors, as ``<=>`` measures it (1 - distance); a zero vector has cosine 0 to everything."""
    matrix = np.frombuffer(b"".join(raw[4:] for raw in raw_vectors), dtype=">f4").astype(np.float32)
    return matrix_nearest_mean_cosines(matrix.reshape(len(raw_vectors), -1), k)


def matrix_nearest_mean_cosines(matrix: np.ndarray, k: int) -> np.ndarray:
    """``nearest_mean_cosines`` of the rows of a matrix (at least two rows; the caller's array is left as it is)."""
    norms = np.linalg.norm(matrix, axis=1)
    matrix = matrix / np.where(norms > 0, norms, 1.0)[:, None]
    sims = matrix @ matrix.T
    np.fill_diagonal(sims, -np.inf)
    take = min(k, len(matrix) - 1)
    return -np.partition(-sims, take - 1, axis=1)[:, :take].mean(axis=1)
