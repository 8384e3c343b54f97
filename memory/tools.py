"""``search_memory``: lets the model look up what it knows about the user beyond what the prompt holds.

It goes through the same tiered retrieval as the prompt (``memory.retrieval.memories_for_prompt``), so
it sees only the signed-in user's own current memories. The memory app offers it to agents through
``settings.AGENT_TOOLS`` like any other package's tool.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from agents.tools import ToolContext, ToolInputError, tool
from memory.retrieval import memories_for_prompt

# Used when there is no agent to take a memory budget from.
DEFAULT_BUDGET_TOKENS = 1000


class SearchMemoryArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    query: str = Field(min_length=1, max_length=500, description="What to look for, in plain words.")
    limit: int = Field(default=5, ge=1, le=20, description="Most memories to return, 1 to 20.")


@tool(
    description=(
        "Search what is remembered about the user (facts, preferences, past conversations). "
        "Use it when the answer may depend on something the user said before."
    )
)
def search_memory(args: SearchMemoryArgs, context: ToolContext) -> str:
    user = context.user
    if user is None or not getattr(user, "is_authenticated", False):
        raise ToolInputError("searching memory needs a signed-in user.")
    agent = context.agent
    found = memories_for_prompt(
        user=user,
        query=args.query,
        agent=agent,
        workflow=context.session.workflow if context.session is not None else "",
        budget_tokens=agent.memory_budget_tokens if agent is not None else DEFAULT_BUDGET_TOKENS,
        relevance_threshold=agent.relevance_threshold if agent is not None else None,
        # The model asked explicitly; a second model call inside the tool would only add latency.
        use_model_filter=False,
    )
    items = found.items[: args.limit]
    if not items:
        return f"No stored memories about the user match {args.query!r}."
    lines = [f"{i}. [{item.memory.kind}] {item.text}" for i, item in enumerate(items, start=1)]
    return "\n".join([f"Memories about the user matching {args.query!r}:", *lines])


# The name settings.AGENT_TOOLS uses.
SEARCH_MEMORY = search_memory
