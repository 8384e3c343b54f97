"""Writes to memory, one module a responsibility; the names every caller uses are imported from here.

- ``writes``: what a door asks for directly: create (or find the same current memory), edit, forget, and
  restore from an export, each embedding its text synchronously;
- ``curation``: what staff do to memories already written: re-embed, pin, archive, merge, and the review of
  a contradicting fact;
- ``turns``: a turn's memory writes, off the request path (the episode and the facts, with supersede and
  review), and the access count of what a prompt used; ``extraction``: the model call that finds the facts;
- ``outbox``: sending a turn's write to the task queue, and the sweep that sends again the lost ones;
- ``indexes``: the per-user vector indexes of big histories;
- ``duplicates``: the content hash, the duplicate check and the per-user write lock every write keeps;
  ``embed``: the texts' embeddings, computed outside any transaction.

Model calls (the embedder, the fact extractor) happen outside database transactions, so no lock is held
while a model runs; the one exception is an edit whose row changed between its read and its lock (the new
text is embedded then, under the user's lock).
"""

from memory.services.curation import (
    memories_merge,
    memories_reembed,
    memories_set_archived,
    memories_set_pinned,
    merge_plan,
    review_apply,
    review_reject,
)
from memory.services.duplicates import content_hash_for, current_duplicate, duplicate_message, lock_user_memories
from memory.services.extraction import EXTRACTION_SYSTEM_PROMPT
from memory.services.indexes import USER_INDEX_BUILD_MEMORY, UserIndexSync, user_indexes_sync, users_needing_own_index
from memory.services.outbox import (
    MEMORY_WRITES_LOOKBACK,
    MEMORY_WRITES_LOST_AFTER,
    MEMORY_WRITES_REQUEUE_AGAIN_AFTER,
    WRITE_TASK,
    memory_writes_enqueue,
    memory_writes_requeue,
    turns_with_lost_memory_writes,
)
from memory.services.turns import (
    EPISODE_IMPORTANCE,
    FACT_IMPORTANCE,
    NEAR_DUPLICATE_SIMILARITY,
    TurnMemoryWriteResult,
    episode_text,
    memories_touch,
    turn_memories_write,
)
from memory.services.writes import (
    EDITABLE_FIELDS,
    MemoryConflict,
    memories_restore,
    memory_create,
    memory_forget,
    memory_get_or_create,
    memory_update,
)

__all__ = [
    "EDITABLE_FIELDS",
    "EPISODE_IMPORTANCE",
    "EXTRACTION_SYSTEM_PROMPT",
    "FACT_IMPORTANCE",
    "MEMORY_WRITES_LOOKBACK",
    "MemoryConflict",
    "MEMORY_WRITES_LOST_AFTER",
    "MEMORY_WRITES_REQUEUE_AGAIN_AFTER",
    "NEAR_DUPLICATE_SIMILARITY",
    "USER_INDEX_BUILD_MEMORY",
    "WRITE_TASK",
    "TurnMemoryWriteResult",
    "UserIndexSync",
    "content_hash_for",
    "current_duplicate",
    "duplicate_message",
    "episode_text",
    "lock_user_memories",
    "memories_merge",
    "memories_reembed",
    "memories_restore",
    "memories_set_archived",
    "memories_set_pinned",
    "memories_touch",
    "memory_create",
    "memory_forget",
    "memory_get_or_create",
    "memory_update",
    "memory_writes_enqueue",
    "memory_writes_requeue",
    "merge_plan",
    "review_apply",
    "review_reject",
    "turn_memories_write",
    "turns_with_lost_memory_writes",
    "user_indexes_sync",
    "users_needing_own_index",
]
