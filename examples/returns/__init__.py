"""A returns-and-refunds agent built on the public extension API only (docs/extending.md walks through it).

- ``tools``: ``order_status`` (look an order up) and ``refund_request`` (the workflow's action), made with
  ``@tool`` from plain functions; the refund rule is Python (``refund_decision``).
- ``workflow``: the ``RETURNS`` workflow, declared once: states, slots with types and rules, the question
  for each, transitions, the action and what its result sets. The decision schema is generated.

Plug it in with settings only (no code of the core apps changes)::

    AGENT_EXTRA_WORKFLOWS=examples.returns.workflow.RETURNS
    AGENT_EXTRA_TOOLS=examples.returns.tools.order_status,examples.returns.tools.refund_request
"""
