from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.utils import timezone
from pgvector.django import HnswIndex, VectorField

# Columns are fixed at migration time; EMBEDDING_DIMENSIONS must match the embedder in use.
EMBEDDING_DIMENSIONS: int = settings.EMBEDDING_DIMENSIONS


class Memory(models.Model):
    """Something the agent knows about a user: an episode, a fact, or a procedure.

    A superseded fact is closed (``valid_to`` set), never deleted, so history stays inspectable.
    """

    class Kind(models.TextChoices):
        EPISODIC = "episodic", "Episodic"
        SEMANTIC = "semantic", "Semantic"
        PROCEDURAL = "procedural", "Procedural"

    # NULL only for procedural memories shared by everyone who talks to ``agent`` / runs ``workflow``
    # (instructions staff write once); every other memory belongs to exactly one user.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="memories"
    )
    agent = models.ForeignKey("agents.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="memories")
    kind = models.CharField(max_length=12, choices=Kind.choices)
    text = models.TextField()
    # Semantic facts may carry a key ("home_airport"); a new value for the same key supersedes the old.
    fact_key = models.CharField(max_length=80, blank=True, db_index=True)
    # Procedural memories: when to include them (keywords / phrase), and for which workflow ("" = any).
    trigger = models.CharField(max_length=200, blank=True)
    workflow = models.CharField(max_length=80, blank=True)
    embedding = VectorField(dimensions=EMBEDDING_DIMENSIONS, null=True, blank=True)
    embedding_model = models.CharField(max_length=120, blank=True)
    search_vector = models.GeneratedField(
        expression=SearchVector("text", config="english"),
        output_field=SearchVectorField(),
        db_persist=True,
    )
    importance = models.FloatField(default=0.5)
    pinned = models.BooleanField(default=False)
    archived = models.BooleanField(default=False)
    needs_review = models.BooleanField(default=False)
    source_session = models.ForeignKey(
        "chat_sessions.ChatSession", null=True, blank=True, on_delete=models.SET_NULL, related_name="memories"
    )
    source_turn = models.ForeignKey(
        "chat_sessions.Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="memories"
    )
    valid_from = models.DateTimeField(default=timezone.now)
    valid_to = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    access_count = models.PositiveIntegerField(default=0)
    last_accessed_at = models.DateTimeField(null=True, blank=True)
    content_hash = models.CharField(max_length=64)
    # When what the memory tells happened (an episode's turn, an event the API was told about); used for
    # recency, for which episodes are neighbours, and shown in the prompt. ``created_at`` is the row's own time.
    occurred_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "memories"
        indexes = [
            # Tier 2 vector search: ORDER BY embedding <=> %(query)s LIMIT k, filtered by user_id with
            # pgvector 0.8 iterative scans (SET hnsw.iterative_scan = relaxed_order).
            HnswIndex(
                name="memory_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
            ),
            # Tier 2 full-text search: WHERE search_vector @@ websearch_to_tsquery('english', %(query)s).
            GinIndex(name="memory_search_gin", fields=["search_vector"]),
            # Tier 1 exact lookups and the admin's filters: WHERE user_id = ? AND kind = ? AND NOT archived.
            models.Index(fields=["user", "kind", "archived"], name="memory_user_kind"),
            # Recent actions / recency ranking: WHERE user_id = ? ORDER BY created_at DESC.
            models.Index(fields=["user", "-created_at"], name="memory_user_recent"),
            # Tier 1 pinned lookup: WHERE user_id = ? AND pinned AND NOT archived ORDER BY importance DESC, id
            # LIMIT 20 (read in order: a big history may have hundreds pinned).
            models.Index(
                fields=["user", "-importance", "id"],
                condition=models.Q(pinned=True, archived=False),
                name="memory_user_pinned_ranked",
            ),
            # Tier 1 profile facts: WHERE user_id = ? AND kind = 'semantic' AND fact_key <> '' AND valid_to IS NULL
            # ORDER BY fact_key.
            models.Index(
                fields=["user", "fact_key"],
                condition=models.Q(kind="semantic", valid_to__isnull=True) & ~models.Q(fact_key=""),
                name="memory_user_profile",
            ),
            # Tier 1 recent actions: WHERE user_id = ? AND kind = 'episodic' AND source_turn_id IS NOT NULL
            # ORDER BY created_at DESC LIMIT 3 (read in order, however many API-written episodes a user has).
            models.Index(
                fields=["user", "-created_at", "-id"],
                condition=models.Q(kind="episodic", source_turn__isnull=False),
                name="memory_user_recent_actions",
            ),
            # Neighbour expansion: the episodes just before and after one, in its own session, by when they
            # happened: WHERE source_session_id = ? AND kind = 'episodic' AND occurred_at < ? ORDER BY occurred_at.
            models.Index(
                fields=["source_session", "occurred_at"],
                condition=models.Q(kind="episodic"),
                name="memory_session_episodes",
            ),
            # The admin's search by fact key, over all users: WHERE fact_key = ? (facts only: a small index).
            models.Index(fields=["fact_key"], condition=~models.Q(fact_key=""), name="memory_fact_key"),
        ]
        constraints = [
            # Only procedural memories may be shared (no owner); episodes and facts always have one.
            models.CheckConstraint(
                condition=models.Q(user__isnull=False) | models.Q(kind="procedural"), name="memory_owner_required"
            ),
            # A retried write task inserts one episodic memory per turn, never two.
            models.UniqueConstraint(
                fields=["source_turn"], condition=models.Q(kind="episodic"), name="memory_one_episode_per_turn"
            ),
            # The same current fact or procedure is stored once per user.
            models.UniqueConstraint(
                fields=["user", "kind", "content_hash"],
                condition=models.Q(valid_to__isnull=True) & ~models.Q(kind="episodic"),
                name="memory_current_unique_content",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.text[:60]}"

    @property
    def is_current(self) -> bool:
        now = timezone.now()
        return (
            not self.archived
            and (self.valid_to is None or self.valid_to > now)
            and (self.expires_at is None or self.expires_at > now)
        )


# What a memory says and how it is used, in the order the doors show it (the API's shape, the admin's form).
MEMORY_CONTENT_FIELDS: tuple[str, ...] = (
    "kind",
    "text",
    "fact_key",
    "trigger",
    "workflow",
    "importance",
    "pinned",
    "archived",
    "needs_review",
)
# The fields staff and clients may change (``memory.services.memory_update``; the admin's form adds the owner).
MEMORY_EDITABLE_FIELDS: tuple[str, ...] = ("agent", *MEMORY_CONTENT_FIELDS, "occurred_at", "valid_to", "expires_at")


class MemoryReview(models.Model):
    """A contradicting fact the extractor was not confident enough to apply: waits for a person."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        APPLIED = "applied", "Applied"
        REJECTED = "rejected", "Rejected"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memory_reviews")
    existing = models.ForeignKey(Memory, on_delete=models.CASCADE, related_name="reviews")
    proposed_text = models.TextField()
    proposed_key = models.CharField(max_length=80, blank=True)
    confidence = models.FloatField()
    reason = models.TextField(blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    source_session = models.ForeignKey("chat_sessions.ChatSession", null=True, blank=True, on_delete=models.SET_NULL)
    source_turn = models.ForeignKey("chat_sessions.Turn", null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"review: {self.proposed_text[:60]}"
