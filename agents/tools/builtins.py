"""The tools that ship with the app; ``agents.tools.registry.default_registry`` registers these."""

from __future__ import annotations

from agents.tools.flights import BOOK_FLIGHT, SEARCH_FLIGHTS
from agents.tools.memory_search import SEARCH_MEMORY
from agents.tools.registry import Tool
from agents.tools.web import HTTP_GET

BUILTIN_TOOLS: tuple[Tool, ...] = (SEARCH_MEMORY, SEARCH_FLIGHTS, BOOK_FLIGHT, HTTP_GET)
