"""The turn: how long a message may be, where a turn runs, its lease, its events, how it decides."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from core.env import env_bool, env_float, env_int, env_str

# The turn loop (orchestrator/runtime.py).
# Longest chat message accepted (characters); longer ones are refused with 413 before anything is saved.
# Shorter ones that exceed the prompt's message budget are cut with a visible marker (sessions/context.py).
MAX_MESSAGE_CHARS = env_int("MAX_MESSAGE_CHARS", 32000, minimum=100)
# Where an accepted turn runs. "worker": on a turn worker (the web request only saves the message and reads the
# turn's events from the run channel: core/events.py); "inline": in the request itself (no worker needed; each
# turn holds a web thread while the model answers). "worker" needs a Redis-protocol server for the channel (the
# embedded Valkey, or REDIS_URL); without one, turns run inline.
TURN_RUNNER = env_str("TURN_RUNNER", "worker") or "worker"
if TURN_RUNNER not in ("worker", "inline"):
    raise ImproperlyConfigured(f"TURN_RUNNER must be 'worker' or 'inline', not {TURN_RUNNER!r}.")
# Back-pressure: with this many turns waiting for a turn worker, a new message is refused with 503 and
# Retry-After (nothing saved) instead of waiting behind them. 0: no limit.
TURN_QUEUE_LIMIT = env_int("TURN_QUEUE_LIMIT", 1000, minimum=0)
# How long a turn may wait in the queue for a worker before its lease runs out and the sweep takes it over.
TURN_QUEUE_SECONDS = env_int("TURN_QUEUE_SECONDS", 300, minimum=10)
# A run's events stay readable (a client that comes back, a second tab) this long after its last one.
RUN_EVENTS_KEEP_SECONDS = env_int("RUN_EVENTS_KEEP_SECONDS", 3600, minimum=60)
RUN_EVENTS_URL = env_str("RUN_EVENTS_URL")
# The run streams' names start with this (the queue by default), so deployments sharing a Redis stay apart.
RUN_EVENTS_PREFIX = env_str("RUN_EVENTS_PREFIX")
TURN_LOCK_WAIT_SECONDS = env_float("TURN_LOCK_WAIT_SECONDS", 30.0, minimum=0.0)
# A turn's runner holds the session's lease (sessions/locks.py) for this long past its last heartbeat (every
# third of it): a runner that dies leaves its turn to the next message or the sweep after at most this long.
TURN_LEASE_SECONDS = env_float("TURN_LEASE_SECONDS", 30.0, minimum=1.0)
# A turn younger than this is never swept, even with its lease gone (a margin for a turn being accepted).
STUCK_TURN_SECONDS = env_int("STUCK_TURN_SECONDS", 10, minimum=0)
# An agent with tools decides inside its reply's own streamed call (its tools and the hand-off offered as functions;
# plain text is the answer): one model call for a turn that needs no tool, the first word at the model's speed.
# Off, or on an endpoint seen refusing tools: a structured routing call first, then the reply (two calls).
TURN_DECISION_IN_REPLY = env_bool("TURN_DECISION_IN_REPLY", True)
# A lease handed to a turn worker (with the turn's task) and not claimed by one for this long, while no task for it
# waits in the turns queue, belonged to a task that was lost: the sweep lets it go and resumes the turn.
TURN_CLAIM_SECONDS = env_float("TURN_CLAIM_SECONDS", 10.0, minimum=1.0)
# While a turn's stream waits (a turn queued, a turn being resumed), it sends an SSE comment this often, so that no
# proxy or client takes a quiet stream for a dead one.
RUN_EVENTS_KEEPALIVE_SECONDS = env_float("RUN_EVENTS_KEEPALIVE_SECONDS", 10.0, minimum=0.5, maximum=60.0)
