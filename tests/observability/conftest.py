from __future__ import annotations

import importlib
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def default_alert_rules(db: Any) -> None:
    """The alert rules the data migration seeds.

    A transactional test elsewhere in the run flushes the tables, data-migration rows included, so
    these tests put the defaults back (the same list the migration uses) when they are missing.
    """
    from observability.models import AlertRule

    defaults = importlib.import_module("observability.migrations.0002_default_rules").DEFAULT_RULES
    defaults = [*defaults, importlib.import_module("observability.migrations.0005_queue_wait_rule").QUEUE_RULE]
    for rule in defaults:
        AlertRule.objects.get_or_create(metric=rule["metric"], name=rule["name"], defaults=rule)
