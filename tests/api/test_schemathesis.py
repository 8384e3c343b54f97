"""Property-based fuzzing of the whole API from its own OpenAPI schema: no input gives a 5xx, and every
status it answers with is documented there.

Schemathesis generates valid and invalid requests for every operation and sends them to a live
server with Alice's token. Path ids are a mix of real ones (so the handlers run deep) and random
ones (so the 404 paths run too). Bounded: a few examples per operation and mode.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from rest_framework.throttling import SimpleRateThrottle
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from agents.models import Agent
from memory.services import memory_create
from sessions.services import session_create
from tests.api.conftest import token_client

pytestmark = [pytest.mark.django_db(transaction=True)]

EXAMPLES_PER_OPERATION = 8


def test_no_input_makes_the_api_fail_with_a_5xx(
    live_server: Any, alice: Any, booking_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The point is every handler, not the throttle (tested on its own): let messages through.
    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "messages", "100000/min")
    client = token_client(alice)
    token = f"Token {Token.objects.get(user=alice).key}"
    session = session_create(user=alice, agent=booking_agent)
    memory = memory_create(user=alice, kind="semantic", text="Prefers morning flights.")
    turn_id = client.post(f"/api/sessions/{session.pk}/messages/", {"message": "Hello"}, format="json").json()["turn"][
        "id"
    ]
    real_ids = {"session_id": str(session.pk), "memory_id": memory.pk, "turn_id": turn_id, "id": booking_agent.pk}

    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/", headers={"Authorization": token})
    operations = [result.ok() for result in schema.get_all_operations() if isinstance(result, Ok)]
    # Deleting first would turn every later request into a 404; run deletions last.
    operations.sort(key=lambda op: op.method.upper() == "DELETE")
    assert len(operations) >= 20
    failures: list[str] = []
    # Every answer's status is in the schema (core/api_schema.py documents the error answers).
    documented = {op.label: set(op.definition.raw["responses"]) for op in operations}
    undocumented: set[str] = set()
    sent = 0

    for operation in operations:
        names = {p.name for p in operation.iter_parameters() if p.location == "path"}
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for ids in ({k: v for k, v in real_ids.items() if k in names}, None):
                if ids is None and not names:
                    continue
                strategy = operation.as_strategy(generation_mode=mode, path_parameters=ids or None)

                @settings(
                    max_examples=EXAMPLES_PER_OPERATION,
                    deadline=None,
                    database=None,
                    phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=strategy)
                def run(case: Any) -> None:
                    nonlocal sent
                    response = case.call(base_url=live_server.url, headers={"Authorization": token}, timeout=30)
                    sent += 1
                    if response.status_code >= 500:
                        failures.append(f"{case.operation.label} -> {response.status_code}: {response.text[:300]}")
                    elif str(response.status_code) not in documented[case.operation.label]:
                        undocumented.add(f"{case.operation.label} -> {response.status_code}")

                try:
                    run()
                except Unsatisfiable:
                    # Nothing left to make invalid (e.g. a GET whose only parameter is a fixed real id).
                    continue

    assert sent > 100
    assert failures == []
    assert sorted(undocumented) == []
