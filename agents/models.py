from __future__ import annotations

import re
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from agents.tools.registry import tool_names
from agents.workflows import code_workflow_names, workflow_choices
from agents.workflows.spec import NAME_PATTERN, WorkflowSpecError, workflow_from_spec
from core.models import Dated
from llm.capabilities import MODE_LABELS
from llm.providers import DEMO_PROFILE
from llm.sections import DEFAULT_SHARES


def default_section_budgets() -> dict[str, float]:
    """Share of the prompt budget each section may use (after the response reserve and safety margin): the
    library's defaults (``llm.sections.DEFAULT_SHARES``); the tools' share is added where an agent has tools."""
    return {section: share for section, share in DEFAULT_SHARES.items() if section != "tools"}


class Agent(Dated):
    """An agent operators configure in the admin: prompt, model, budgets, workflow, tools, limits."""

    class StepLimitBehaviour(models.TextChoices):
        ERROR = "error", "Reply with an error"
        PARTIAL = "partial", "Give a partial answer"
        HANDOFF = "handoff", "Hand to a human"

    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=80, unique=True)
    description = models.TextField(blank=True)
    system_prompt = models.TextField()
    # Name of an endpoint profile in settings.LLM_PROFILES ("" = the default profile). Keys stay in the environment.
    endpoint = models.CharField(max_length=80, blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="", help_text="Blank: the endpoint's default model.")
    temperature = models.FloatField(default=0.3, validators=[MinValueValidator(0.0), MaxValueValidator(2.0)])
    max_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        default=None,
        validators=[MinValueValidator(16)],
        help_text=(
            "Largest reply, in tokens. Blank (recommended): an eighth of the context window, at least 1,024. "
            "A prose reply cut off at this limit is continued, up to three times."
        ),
    )
    context_window = models.PositiveIntegerField(default=8192, help_text="The model's context window, in tokens.")
    response_reserve = models.PositiveIntegerField(default=768, help_text="Tokens kept free for the reply.")
    safety_margin = models.FloatField(
        default=0.12,
        validators=[MinValueValidator(0.10), MaxValueValidator(0.15)],
        help_text="Share of the window kept unused.",
    )
    section_budgets = models.JSONField(default=default_section_budgets)
    window_turns = models.PositiveIntegerField(default=10, validators=[MinValueValidator(3)])
    memory_budget_tokens = models.PositiveIntegerField(default=2000)
    workflow = models.CharField(max_length=80, default="free_chat")
    tools = models.JSONField(default=list, blank=True, help_text="Names of enabled tools.")
    step_limit = models.PositiveIntegerField(default=8, validators=[MinValueValidator(1), MaxValueValidator(50)])
    step_limit_behaviour = models.CharField(
        max_length=10, choices=StepLimitBehaviour.choices, default=StepLimitBehaviour.PARTIAL
    )
    relevance_threshold = models.FloatField(
        null=True,
        blank=True,
        default=None,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text=(
            "Blank (recommended): memories are kept by how they compare with the best match for each message "
            "(calibrated), or by the cheap model's score of 0.5 when one is configured. A number: an absolute "
            "cut-off instead (0 keeps every candidate)."
        ),
    )
    routing_confidence_threshold = models.FloatField(
        default=0.4, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    is_active = models.BooleanField(
        default=True,
        help_text="Off: not offered for new chats, and its chats take no new message (they stay readable).",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Values the runtime can use, checked when an operator saves the agent (the admin's form calls this):
        a typo here would otherwise fail every session of the agent, or every page that lists it."""
        errors: dict[str, str] = {}
        workflows = [name for name, _title in workflow_choices()]
        unchanged = self.pk is not None and Agent.objects.filter(pk=self.pk, workflow=self.workflow).exists()
        if self.workflow not in workflows and not unchanged:
            errors["workflow"] = f"Unknown workflow {self.workflow!r}; known: {', '.join(workflows)}."
        profiles = sorted(getattr(settings, "LLM_PROFILES", {}) or {})
        if self.endpoint and self.endpoint != DEMO_PROFILE and self.endpoint not in profiles:
            errors["endpoint"] = (
                f"No endpoint profile {self.endpoint!r} is configured; configured: {', '.join(profiles) or 'none'} "
                f"(or blank for the default, {DEMO_PROFILE!r} for the demo model)."
            )
        budgets = self.section_budgets
        if not isinstance(budgets, dict) or not all(
            name in DEFAULT_SHARES
            and isinstance(share, int | float)
            and not isinstance(share, bool)
            and 0 <= share <= 1
            for name, share in budgets.items()
        ):
            errors["section_budgets"] = (
                "An object of section shares between 0 and 1, with sections among: " + ", ".join(DEFAULT_SHARES) + "."
            )
        known_tools = tool_names()
        if not isinstance(self.tools, list) or not all(isinstance(t, str) and t in known_tools for t in self.tools):
            errors["tools"] = "A list of tool names among: " + ", ".join(known_tools) + "."
        if errors:
            raise ValidationError(errors)


class LLMCall(models.Model):
    """One model call, whatever its outcome: the raw material of the death-spiral indicators."""

    # No index of its own: llmcall_agent_time (agent, created_at) leads with it.
    agent = models.ForeignKey(
        Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls", db_index=False
    )
    session = models.ForeignKey(
        "chat_sessions.ChatSession", null=True, blank=True, on_delete=models.SET_NULL, related_name="llm_calls"
    )
    turn = models.ForeignKey(
        "chat_sessions.Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="llm_calls"
    )
    purpose = models.CharField(max_length=20)
    provider = models.CharField(max_length=20)
    model = models.CharField(max_length=200)
    prompt_tokens = models.PositiveIntegerField(default=0)
    prompt_sections = models.JSONField(default=dict, blank=True)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.FloatField(default=0.0)
    ttft_ms = models.FloatField(null=True, blank=True)
    retries = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=20)
    finish_reason = models.CharField(max_length=30, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Dashboard and alerts: "calls of agent X in the last hour" (WHERE agent_id = ? AND created_at >= ?).
            models.Index(fields=["agent", "created_at"], name="llmcall_agent_time"),
            # The admin's and the dashboard's filters. Plain btrees: nothing searches these with LIKE.
            models.Index(fields=["purpose"], name="llmcall_purpose"),
            models.Index(fields=["outcome"], name="llmcall_outcome"),
        ]

    def __str__(self) -> str:
        return f"{self.purpose} {self.model} {self.outcome}"


class ToolInvocation(models.Model):
    """One tool run inside a turn: arguments, the string it returned, and whether that was a TOOL_ERROR."""

    session = models.ForeignKey("chat_sessions.ChatSession", on_delete=models.CASCADE, related_name="tool_invocations")
    turn = models.ForeignKey(
        "chat_sessions.Turn", null=True, blank=True, on_delete=models.CASCADE, related_name="tool_invocations"
    )
    name = models.CharField(max_length=80)
    arguments = models.JSONField(default=dict, blank=True)
    result = models.TextField(blank=True)
    ok = models.BooleanField(default=True)
    error_kind = models.CharField(max_length=40, blank=True)
    attempts = models.PositiveIntegerField(default=1)
    latency_ms = models.FloatField(default=0.0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({'ok' if self.ok else self.error_kind})"


class WorkflowDefinition(Dated):
    """A workflow an operator declares in the admin, as JSON (docs/extending.md, "Workflows as data").

    Saving a changed declaration makes a new ``WorkflowVersion`` (``agents.workflow_store``): new sessions
    start on the latest, a running session keeps the version it started on."""

    name = models.CharField(
        max_length=60,
        unique=True,
        help_text="What agents refer to; a letter, then letters, digits or '_'. Cannot be a workflow of the code's.",
    )
    spec = models.JSONField(default=dict, help_text="The declaration: title, slots, states, transitions, actions.")
    version = models.PositiveIntegerField(default=0, editable=False, help_text="The latest version's number.")
    is_active = models.BooleanField(default=True, help_text="Off: no new agent may choose it; running sessions go on.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} (v{self.version})"

    def clean(self) -> None:
        """Checked when an operator saves it (the admin's form calls this): the name, and the declaration."""
        errors: dict[str, list[str]] = {}
        if self.name in code_workflow_names():
            errors["name"] = [f"{self.name!r} is a workflow of the code's; choose another name."]
        if not NAME_PATTERN.fullmatch(self.name or ""):
            errors["name"] = ["A letter, then letters, digits or '_' (at most 48)."]
        if not isinstance(self.spec, dict):
            errors["spec"] = ["A JSON object: title, initial_state, slots, states, transitions, actions."]
        else:
            try:
                workflow_from_spec(self.name, self.spec, tools=tool_names())
            except WorkflowSpecError as exc:
                spec_problems = [problem for problem in exc.problems if not problem.startswith("name ")]
                if spec_problems:
                    errors["spec"] = spec_problems
        if errors:
            raise ValidationError(errors)


class WorkflowVersion(models.Model):
    """One saved declaration of a ``WorkflowDefinition``; never changed once written."""

    definition = models.ForeignKey(WorkflowDefinition, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    spec = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["definition", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["definition", "version"], name="workflow_version_once"),
        ]

    def __str__(self) -> str:
        return f"{self.definition.name} v{self.version}"


class EndpointCapability(models.Model):
    """What an endpoint was found to take for structured outputs (``llm.capabilities``), learned by
    trying: one row per profile, base URL and model. Written by the calls themselves; shown in the admin
    and on /ops/. Delete a row to have it learned again."""

    profile = models.CharField(max_length=80)
    base_url = models.CharField(max_length=500)
    model = models.CharField(max_length=200)
    structured_mode = models.CharField(max_length=20, choices=list(MODE_LABELS.items()))
    detail = models.TextField(blank=True, help_text="Why the formats before this one were given up.")
    learned_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["profile", "base_url", "model"], name="endpoint_capability_unique"),
        ]
        ordering = ["profile", "model"]
        verbose_name_plural = "endpoint capabilities"

    def __str__(self) -> str:
        return f"{self.profile} · {self.model}: {self.structured_mode}"


def validate_key_variable(value: str) -> None:
    """The name of the variable that holds an endpoint's key: an upper-case name that says it is a key (ends in
    _KEY or _TOKEN), never one the app's own settings read (its secret, its database's or broker's address)."""
    if not value:
        return
    if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,99}_(?:API_KEY|KEY|TOKEN)", value):
        raise ValidationError(
            "Name an environment variable that holds only this key, e.g. OLLAMA_API_KEY (ends in _KEY or _TOKEN)."
        )
    if value in FORBIDDEN_KEY_VARIABLES or value.startswith(("DJANGO_", "DATABASE", "CELERY_", "REDIS_")):
        raise ValidationError(f"{value} is one of the app's own settings, not a model endpoint's key.")


FORBIDDEN_KEY_VARIABLES = frozenset({"SECRET_KEY", "METRICS_TOKEN", "EMBEDDING_API_KEY", "FIRST_STAFF_PASSWORD"})


def validate_endpoint_url(value: str) -> None:
    """http(s)://host[:port][/path]: any host name a server can resolve (``ollama`` in a compose file too, which
    Django's URLValidator refuses for want of a dot)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValidationError("Enter the endpoint's base URL, like http://127.0.0.1:11434/v1.")
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError as exc:
        raise ValidationError("The port is not a number from 1 to 65535.") from exc


class ModelEndpoint(Dated):
    """A model endpoint connected from the admin (the first-run form): an endpoint profile kept in the database.

    Profiles from the environment (``LLM_BASE_URL``…, ``LLM_PROFILES_JSON``) win over one of the same name
    here. The API key is never stored: ``api_key_env`` names the environment variable that holds it."""

    name = models.SlugField(
        max_length=80,
        unique=True,
        default="default",
        help_text="The profile name agents use (their “endpoint”). “default” answers every agent that names none.",
    )
    base_url = models.CharField(
        max_length=500,
        validators=[validate_endpoint_url],
        help_text="The OpenAI-compatible API's base URL, e.g. http://127.0.0.1:11434/v1 (Ollama).",
    )
    model = models.CharField(max_length=200, help_text="The model's name at that endpoint.")
    api_key_env = models.CharField(
        max_length=100,
        blank=True,
        validators=[validate_key_variable],
        help_text="The name of the environment variable that holds the API key (blank: the endpoint needs none). "
        "The key itself is never stored.",
    )
    context_window = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(512)],
        help_text="The model's context window in tokens, when known: a ceiling for the agents on this endpoint.",
    )
    last_test = models.JSONField(default=dict, blank=True, help_text="What the last Test found.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}: {self.model} at {self.base_url}"

    def as_profile(self) -> dict[str, object]:
        """The endpoint as an ``LLM_PROFILES`` entry."""
        return {
            "base_url": self.base_url,
            "model": self.model,
            "api_key_env": self.api_key_env,
            "context_window": self.context_window,
        }


class Erasure(models.Model):
    """That a person's data was erased: by whom, when, how much (``people.erasure.person_erase``). Nothing of
    what was erased: only the subject's id (their account stays) and counts."""

    subject_id = models.BigIntegerField(db_index=True, help_text="The id of the user whose data was erased.")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who erased it (blank: a management command).",
    )
    erased_at = models.DateTimeField(auto_now_add=True)
    counts = models.JSONField(default=dict)

    class Meta:
        ordering = ["-erased_at"]

    def __str__(self) -> str:
        return f"user #{self.subject_id} erased {self.erased_at:%Y-%m-%d %H:%M}"
