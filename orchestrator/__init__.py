"""The turn, as a pipeline: ``orchestrator.runtime`` accepts a message and runs these steps over a ``TurnContext``.

- ``runtime``: the entry points (``turn_run``, ``turn_stream``), and the names the doors import;
- ``begin``: validate the message, take the session's lease, save the turn before any model call;
- ``pipeline``: run an accepted turn, here: the steps below in order, yielded as events;
- ``worker``: send an accepted turn to a turn worker, and what the worker runs; ``channel``: its events on the
  run channel, for the doors to follow;
- ``recovery``: finish the turns a dead process left, and the sweep that finds them;
- ``staff``: hand a session to a person and back, and the replies staff write;
- ``context``: ``TurnContext`` (what the steps share) and the typed events a turn yields;
- ``steps``: refuse if the agent is off, stop if handed off, retrieve, decide the workflow step, route;
- ``reply``: the reply with tools under the step limit, and what an action state's tool decides;
- ``finish``: save the outcome (completed or failed) through the fence, and enqueue the after-work.
"""
