"""The llm library stays a library: no ORM, no app of the project but the core's pure helpers."""

from __future__ import annotations

import ast
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1] / "llm"
# What the library may import from the project: itself and the core's pure modules.
ALLOWED_PROJECT = ("llm", "core.errors", "core.text")
PROJECT = ("agents", "sessions", "memory", "observability", "config", "web", "orchestrator", "people", "examples")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def test_the_llm_library_imports_no_orm_and_no_app() -> None:
    offending = []
    for path in sorted(LIBRARY.rglob("*.py")):
        for module in _imports(path):
            if module.startswith(("django.db", "django.contrib")):
                offending.append(f"{path.relative_to(LIBRARY)}: {module}")
            elif module.split(".")[0] in PROJECT and not module.startswith(ALLOWED_PROJECT):
                offending.append(f"{path.relative_to(LIBRARY)}: {module}")
    assert offending == []
    assert len(list(LIBRARY.rglob("*.py"))) >= 10  # the check saw the library (its packages too)
