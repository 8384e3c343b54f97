"""The agents the stack starts with: the built-in ones, then those packages seed (``AGENT_SEEDS``).

A seed is a dict of ``Agent`` fields with a ``slug``. ``settings.AGENT_SEEDS`` lists dotted paths to a seed, a
list of them, or a callable returning either; installed packages add theirs through the entry-point group
``agents_runtime.agent_seeds``. ``default_agents_ensure`` (``manage.py runstack``) creates the missing ones.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured

from agents.models import Agent
from agents.workflows import workflow_choices
from core.plugins import load_plugins

ASSISTANT_PROMPT = (
    "You are a helpful, concise assistant. Use what you remember about the user when it helps, "
    "and say so when you do not know something."
)

# The product's own agents; examples and packages of yours seed theirs through AGENT_SEEDS.
DEFAULT_AGENTS: list[dict[str, object]] = [
    {
        "slug": "assistant",
        "name": "Assistant",
        "description": "Free chat with memory.",
        "system_prompt": ASSISTANT_PROMPT,
        "workflow": "free_chat",
        "tools": ["search_memory"],
    },
]

# Installable packages seed agents under this entry-point group: each entry names a seed, a list of them, or a
# callable returning either (as an AGENT_SEEDS entry does).
AGENT_SEEDS_ENTRY_POINT_GROUP = "agents_runtime.agent_seeds"


def configured_agent_seeds() -> list[dict[str, object]]:
    """The built-in agents, then the seeds of ``settings.AGENT_SEEDS``, then those of installed packages' entry
    points. ``ImproperlyConfigured`` names an entry that cannot be imported, is not a seed (a dict of ``Agent``
    fields with a ``slug``), or seeds a slug another seed has."""
    found = [*DEFAULT_AGENTS]
    found += load_plugins("AGENT_SEEDS", getattr(settings, "AGENT_SEEDS", []), AGENT_SEEDS_ENTRY_POINT_GROUP, _as_seeds)
    slugs = [str(seed["slug"]) for seed in found]
    twice = sorted({slug for slug in slugs if slugs.count(slug) > 1})
    if twice:
        raise ImproperlyConfigured(f"more than one agent seed has the slug {', '.join(map(repr, twice))} (AGENT_SEEDS)")
    return found


def _as_seeds(value: object, source: str) -> list[dict[str, object]]:
    if callable(value):
        try:
            value = value()
        except Exception as exc:  # a broken seed must say which one it is
            raise ImproperlyConfigured(f"{source} failed: {exc}") from exc
    seeds = [value] if isinstance(value, dict) else value
    if not isinstance(seeds, list | tuple) or not seeds or not all(isinstance(seed, dict) for seed in seeds):
        raise ImproperlyConfigured(
            f"{source} is {type(value).__name__}, not an agent seed (a dict of Agent fields with a slug), "
            "a list of them, or a callable returning either"
        )
    for seed in seeds:
        if not isinstance(seed.get("slug"), str) or not seed["slug"]:
            raise ImproperlyConfigured(f"{source}: a seed has no slug")
        for name in seed:
            try:
                Agent._meta.get_field(name)
            except FieldDoesNotExist:
                raise ImproperlyConfigured(f"{source}: {name!r} is not a field of Agent") from None
    return [dict(seed) for seed in seeds]


def default_agents_ensure() -> list[Agent]:
    """Create the seeded agents if they are missing; never overwrite what operators changed."""
    agents = []
    workflows = {name for name, _title in workflow_choices()}
    for spec in configured_agent_seeds():
        if spec.get("workflow", "free_chat") not in workflows:
            continue  # its example is not plugged in (AGENT_WORKFLOWS): no agent that could not answer
        fields = {k: v for k, v in spec.items() if k != "slug"}
        agent, _ = Agent.objects.get_or_create(slug=str(spec["slug"]), defaults=fields)
        agents.append(agent)
    return agents
