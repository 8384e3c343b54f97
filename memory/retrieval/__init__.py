"""Memory retrieval: the tiered search every door uses (runtime, API, admin, the search_memory tool), one
module a stage; ``pipeline`` runs them in order (its docstring has the tiers).

- ``query``: what to search for, and its vector; ``cheap``: the cheap model's calls;
- ``exact``: tier 1's lookups and the procedures' triggers;
- ``words``, ``vector``, ``hybrid``, ``neighbours``: tier 2's arms, their fusion and the candidates' rows
  (``sql``: the pieces of SQL they share);
- ``relevance``: tier 3's filter; ``rank``: tier 4's ranking and budget; ``result``: what comes back;
- ``redundancy``: how much a user's memories look alike, and so how far fusion corrects meaning;
- ``tuning``: the constants, read by every stage from there.

Reads only, but for the access count of what a search returned (``memory.services.memories_touch``).
"""

from memory.retrieval.exact import trigger_matches
from memory.retrieval.hybrid import HybridSearch, hybrid_candidates
from memory.retrieval.pipeline import memories_for_prompt, memory_search
from memory.retrieval.query import RetrievalQuery, retrieval_query
from memory.retrieval.rank import prompt_text
from memory.retrieval.redundancy import redundancies_forget
from memory.retrieval.result import CandidateReport, HybridCandidate, RetrievedMemories, RetrievedMemory
from memory.retrieval.sql import RecentWindow
from memory.retrieval.vector import history_sizes_forget
from memory.retrieval.words import word_candidates

__all__ = [
    "CandidateReport",
    "HybridCandidate",
    "HybridSearch",
    "RecentWindow",
    "RetrievalQuery",
    "RetrievedMemories",
    "RetrievedMemory",
    "history_sizes_forget",
    "hybrid_candidates",
    "memories_for_prompt",
    "memory_search",
    "prompt_text",
    "redundancies_forget",
    "retrieval_query",
    "trigger_matches",
    "word_candidates",
]
