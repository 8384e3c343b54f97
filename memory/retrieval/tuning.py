"""The constants of retrieval, in one place: every stage reads them from here (``tuning.NAME``), so a sweep
(bench/memory_eval.py ``--set`` / ``--sweep``) or a test can change one for every stage at once.

Every constant below was chosen on the tuning split of bench/memory_eval.py (every 4th query of each of
its corpora); docs/memory.md has the held-out figures and the command.
"""

from __future__ import annotations

from datetime import timedelta

FUSION = "cc"  # "rrf": reciprocal rank fusion; "cc": convex combination of the arms' scores (hybrid.convex_fusion)
VECTOR_SHARE = 0.6  # "cc": the cosine's share of the fused score when the word arm has earned its whole weight
# "cc": the word arm earns its weight (1 - VECTOR_SHARE) per query, by how much of the query's information its
# best match covers: the idf-weighted share of the query's words that the best-matching memory has. At or under
# WORD_TRUST_FLOOR no memory answers to the query's words as a whole: they are scattered over memories that
# each share an incidental word or two (a long message of several utterances: "work", "dinner", a name said
# in passing), and the fused score is meaning alone. From WORD_TRUST_FULL the word arm has its whole weight
# (a question whose informative words, a name, a code, a place, one memory has); linear in between.
WORD_TRUST_FLOOR = 0.2
WORD_TRUST_FULL = 0.3
# "cc", off by default (0): the candidate that plain cosine ranks r-th gets at least the fused score the
# (DENSE_DILATION * r)-th had before this floor (for DENSE_DILATION * r up to DENSE_DILATION_UPTO; several lifted
# at once may push each other a few places further), so that words and the hubness
# correction reorder what meaning put near the top but cannot bury it. At 2 it took the `people` corpus (short
# turns over independent facts) from 0.093 / 0.046 below plain dense to 0.068 / 0.025 below at recall@5 / @10,
# and LoCoMo turns from 0.722 to 0.709 at recall@10 (held-out, 2026-12-07; bench/README.md): a store of
# independent facts gains, a store of conversation turns loses, and no per-query signal tried tells them apart.
DENSE_DILATION = 0.0
DENSE_DILATION_UPTO = 25
# "cc": the corrections of meaning (the word arm, the hubness correction below) are applied in proportion to
# how redundant the user's store is (redundancy.py): a store of conversation turns, where each memory has
# lookalikes by meaning, gets them whole; in a store of independent facts, where the cosine already points at
# the memory, only the query's words with a digit (a code, a number: what an embedder reads poorly) count in
# the word arm, and the hubness correction is HUB_DIVERSE_SHARE of its weight. Redundancy: the mean cosine of
# each of the newest REDUNDANCY_SAMPLE memories to its REDUNDANCY_K nearest fellows among them, kept per user
# and process for REDUNDANCY_TTL_SECONDS; the share is 0 at or under REDUNDANCY_FLOOR, 1 from REDUNDANCY_FULL
# (the measured stores: 0.37 to 0.50 for independent facts, 0.565 to 0.715 for LoCoMo's turns, observations
# and call-backs; bench/README.md). REDUNDANCY_FLOOR = REDUNDANCY_FULL = -1 applies them whole everywhere (with
# CALIBRATED_KEEP_AT_LEAST = 0, as before 2026-12-07).
REDUNDANCY_SAMPLE = 256
REDUNDANCY_K = 10
REDUNDANCY_TTL_SECONDS = 300.0
REDUNDANCY_MIN_MEMORIES = 32  # a smaller store is not measured: the corrections apply whole
REDUNDANCY_FLOOR = 0.50
REDUNDANCY_FULL = 0.56
HUB_DIVERSE_SHARE = 0.25  # the share of HUB_WEIGHT applied in a store of independent facts (all of it from FULL)
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
# ... but the first CALIBRATED_KEEP_AT_LEAST candidates by fused score (of those tier 1 did not take, in the
# turn's scope) pass it whatever their share or meaning gap, in every store, ranked after every relevant one:
# where one memory stands far above the rest (a store of independent facts, meaning alone), the cuts dropped
# memories still among the first few by meaning. (10 until issue 56: ten memories a query whatever it asked.)
CALIBRATED_KEEP_AT_LEAST = 3
# The budget is a ceiling, not a target (issue 56): the calibrated filter puts at most CALIBRATED_MAX_KEPT
# memories of tier 2 into a prompt (it kept up to MEMORY_MAX_KEPT, 25, and the budget took them all: 23
# memories a query where a question rests on one to three). In a store of independent facts a candidate whose
# cosine lies more than MEANING_GAP below the best candidate's is not relevant (the cosine already points at
# the memory there); the gap widens with the store's corrections (MEANING_GAP / (1 - corrections)) and is
# none in a redundant store, where lookalikes crowd the best cosine. Chosen on the tuning split for recall and
# precision together (bench/README.md).
CALIBRATED_MAX_KEPT = 10
MEANING_GAP = 0.25
# An agent's scope (relevance.scope_weights): in a turn of a task workflow (a booking), the episodes of the
# user's chat sessions of another workflow (free chat's small talk) are out of scope: their relevance and rank
# score are weighed by SCOPE_OUTSIDE_WEIGHT, and the calibrated filter's first-few floor does not pass them.
# Under RELATIVE_KEEP: without a model nothing tells small talk from an answer but the query's own scale, where
# the best of a poor lot is 1.0 of itself, so the calibrated filter keeps no episode of another workflow; the
# listwise reranker's picks (1.0 down to 0.5) still pass its cut (half of RELATIVE_KEEP) weighed, and rank
# after those in scope. Facts, procedures and episodes of no session are in every scope; a turn of an open
# workflow (or none: the API's search) has no scope.
SCOPE_OUTSIDE_WEIGHT = 0.25
SCOPE_OPEN_WORKFLOWS = ("", "free_chat")
# The listwise reranker (relevance._reranked; MEMORY_MODEL_JUDGE "rerank"): the best RERANK_CANDIDATES fused
# candidates go to the cheap model in one call; its pace is an average with RERANK_PACE_WEIGHT on the newest
# call, and a call expected past its budget is still tried once every RERANK_RETRY_SECONDS.
RERANK_CANDIDATES = 20
RERANK_PACE_WEIGHT = 0.3
RERANK_RETRY_SECONDS = 60.0
PREVIEW_CHARS = 160
MODEL_FILTER_CHARS = 400  # per memory in the relevance prompt
PROFILE_LIMIT = 20
PINNED_LIMIT = 20

# The query (query.retrieval_query).
QUERY_CONTEXT_TURNS = 2  # the user's earlier messages searched with the new one
QUERY_CONTEXT_CHARS = 600  # at most this much of them
QUERY_STANDALONE_WORDS = 6  # a message with this many words is searched alone (a shorter one is a follow-up)
