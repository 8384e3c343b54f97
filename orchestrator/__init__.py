"""The turn, as a pipeline: ``orchestrator.runtime`` accepts a message and runs these steps over a ``TurnContext``.

- ``context``: ``TurnContext`` (what the steps share) and the typed events a turn yields;
- ``steps``: refuse if the agent is off, stop if handed off, retrieve, decide the workflow step, route;
- ``reply``: the reply with tools under the step limit, and what an action state's tool decides;
- ``finish``: save the outcome (completed or failed) through the fence, and enqueue the after-work.
"""
