"""The word arm of tier 2: full-text candidates ranked by the idf-weighted share of the query's words they
contain. Needs no query vector, so it runs while the query is being embedded."""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

from memory.retrieval import tuning
from memory.retrieval.sql import CURRENT_SQL, NOT_IN_WINDOW_SQL, RecentWindow, window_params

# Letters and digits of any script, as the tsvector has them: "Kiełbasa" is one word, not "kie" and "basa"; a
# combining mark left after NFC (the dot of a lower-cased "İ") stays inside its word.
WORD = re.compile(r"(?:[^\W_]|[\u0300-\u036f])+")


def query_terms(query: str) -> list[str]:
    """Distinct words of the query, lower-cased, in order (safe to put into a tsquery)."""
    seen: dict[str, None] = {}
    for word in WORD.findall(unicodedata.normalize("NFC", query).lower()):  # "Sa\u0303o" (typed decomposed) is "São"
        if len(word) > 1 or word.isdigit():
            seen.setdefault(word, None)
    return list(seen)[:32]


def is_code(word: str) -> bool:
    """A word with a digit: a code, a number, a reference ("qx7731", "5528190", "a64"): what a sentence
    embedder reads poorly, so the word arm counts it in every store (``word_candidates``' ``corrections``)."""
    return any(ch.isdecimal() for ch in word)


def word_candidates(
    *,
    user_id: int,
    query: str,
    now: datetime,
    limit: int | None = None,
    window: RecentWindow | None = None,
    corrections: float = 1.0,
) -> list[tuple[int, float]]:
    """Full-text candidates ranked by the idf-weighted share of query words they contain, best first:
    (id, share). Needs no query vector, so it runs while the query is being embedded.

    ``corrections`` (``redundancy.correction_scale`` of the user's store, 0 to 1) is how far the words
    without a digit count: each plain word's idf is weighed by it, a code's (``is_code``) is not, in what a
    memory has and in the query's total alike. In a store of independent facts (0) a memory shares a plain
    word with the query by chance as often as by meaning, and meaning finds it better; a code the embedder
    cannot read is still found by its word, as much as if the query said nothing else (and only the codes
    choose the pool: plain words cannot crowd an old code out of it). Rows with no share are left out.

    Returns the best ``limit`` and every row tied with the last of them (newer first):
    ``hybrid_candidates`` breaks those ties by closeness to the query once the query's vector is there.
    (Breaking them by recency here instead cost LoCoMo recall@10 0.714 -> 0.691; handing over at most four
    times ``limit``, 0.712.)

    Postgres' ts_rank has no inverse document frequency, so a word in every memory (a speaker's name,
    "user") would count as much as a rare one. The idf is estimated on this user's matching memories: the
    newest ``TEXT_POOL`` of them (streamed from the user index, so a huge history costs no more than that).
    """
    terms = query_terms(query)
    corrections = float(min(1.0, max(0.0, corrections)))
    if corrections <= 0:
        terms = [term for term in terms if is_code(term)]
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

    def weighed(part: str) -> str:
        """``part`` (formatted with each term's index) summed over the plain words times the corrections,
        plus over the codes."""
        plain = " + ".join(part.format(i=i) for i, term in enumerate(terms) if not is_code(term)) or "0"
        coded = " + ".join(part.format(i=i) for i, term in enumerate(terms) if is_code(term)) or "0"
        return f"%(corrections)s * ({plain}) + ({coded})"

    weight, total = weighed("h{i} * w{i}"), weighed("w{i}")
    sql = f"""
        WITH pool AS MATERIALIZED (
            SELECT id, created_at, {hits}
            FROM memory_memory
            WHERE user_id = %(user)s AND kind <> 'procedural' AND {CURRENT_SQL} AND {NOT_IN_WINDOW_SQL}
              AND search_vector @@ to_tsquery('english', %(any)s)
            ORDER BY created_at DESC LIMIT %(pool)s  -- the newest matches: index memory_user_recent, streamed
        ), idf AS (SELECT {idf} FROM pool),
        scored AS MATERIALIZED (SELECT * FROM (
            SELECT id, created_at, ({weight}) / COALESCE(NULLIF({total}, 0), 1.0) AS share FROM pool, idf
        ) shares WHERE share > 0)
        SELECT id, share FROM scored
        WHERE share >= (SELECT share FROM scored ORDER BY share DESC OFFSET %(limit)s - 1 LIMIT 1)
           OR (SELECT count(*) FROM scored) <= %(limit)s
        ORDER BY share DESC, created_at DESC, id DESC
    """
    params: dict[str, Any] = {
        "user": user_id,
        "now": now,
        "any": " | ".join(terms),
        "pool": tuning.TEXT_POOL,
        "limit": limit,
        "corrections": corrections,
        **window_params(window),
        **{f"t{i}": term for i, term in enumerate(terms)},
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [(int(i), float(share)) for i, share in cursor.fetchall()]
