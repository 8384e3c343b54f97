"""The admin of the agents app: agents (``definitions``), the models they use (``endpoints``: connecting one,
and what each was found to take for structured outputs), the workflows declared as data (``workflows``), and
the logs of model and tool calls (``calls``). People and their API tokens: ``web.admin.users``.
"""

from web.admin.agents import calls, definitions, endpoints, workflows
from web.admin.agents.workflows import EXAMPLE_DECLARATION

__all__ = ["EXAMPLE_DECLARATION", "calls", "definitions", "endpoints", "workflows"]
