"""The prompt's sections and the share of the prompt each may take by default (an agent's
``section_budgets`` overrides any of them; ``llm.prompt.ContextBudget`` applies them)."""

from __future__ import annotations

# Used when an agent's section_budgets has no entry for a section (older agents have no "tools").
DEFAULT_SHARES: dict[str, float] = {
    "system": 0.10,
    "workflow": 0.08,
    "procedural": 0.05,
    "memories": 0.20,
    "summary": 0.12,
    "recent": 0.35,
    "message": 0.10,
    "tools": 0.10,
}
