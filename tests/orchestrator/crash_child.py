"""A process that runs one turn and is killed mid-call by tests/orchestrator/test_runtime_crash.py.

Run as ``python -m tests.orchestrator.crash_child <session_id> <message>`` with DATABASE_URL pointing at the
test database and LLM_PROFILES_JSON pointing at a fake server that hangs.
"""

from __future__ import annotations

import os
import sys

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from orchestrator.runtime import turn_run
    from sessions.models import ChatSession

    session = ChatSession.objects.get(pk=sys.argv[1])
    turn_run(session=session, message=sys.argv[2])


if __name__ == "__main__":
    main()
