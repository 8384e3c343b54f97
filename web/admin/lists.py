"""Admin change lists that stay quick on tables of millions of rows: the logs (turns, checkpoints, model and
tool calls) and the memories.

Django's defaults read a whole table on every page of its change list, three ways:

- the count of all rows, taken twice once a filter is on (the filtered count and the "of N" total);
- a filter on a plain column (``list_filter = ("state",)``) lists the column's distinct values;
- ``date_hierarchy`` lists the distinct years (months, days) of the date column.

At a million rows each costs 0.1-0.4 s, and a page a second (``python -m bench admin_scale``); a log grows
by rows a turn. Here: the unfiltered count is the planner's estimate once the table is big, the total is
not shown, filters offer values known to the code, and date filters are fixed ranges
(``DateFieldListFilter``: today, past 7 days, this month, this year).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from agents.workflows import get_workflow, workflow_choices

# Below this many rows an exact count is cheap enough (a few milliseconds), and exact.
ESTIMATE_COUNT_ABOVE = 100_000


def estimated_rows(model: type[Model], *, using: str = "default") -> int:
    """The planner's estimate of the table's rows (``pg_class.reltuples``, kept by ANALYZE and autovacuum);
    -1 when the table was never analyzed."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [model._meta.db_table])
        row = cursor.fetchone()
    return int(row[0]) if row else -1


class EstimatedCountPaginator(Paginator):
    """Counts an unfiltered list of a big table by the planner's estimate; any filtered list exactly.

    The estimate is within a few per cent of the truth after autovacuum's last ANALYZE: the page links at
    the far end may be one off (an empty last page, or one page not linked), which a filter settles.
    """

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if isinstance(rows, QuerySet) and not rows.query.where and not rows.query.distinct:
            estimate = estimated_rows(rows.model, using=rows.db)
            if estimate >= ESTIMATE_COUNT_ABOVE:
                return estimate
        return int(super().count)


class LogAdmin(admin.ModelAdmin):
    """A change list for a table that grows by rows a turn: no whole-table count on any page."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False


def known_values_filter(field: str, title: str, values: Callable[[], Iterable[str]]) -> type[admin.SimpleListFilter]:
    """A sidebar filter on ``field`` offering ``values()`` (known to the code: states of the registered
    workflows, tool names), not the column's distinct values (a scan of the table on every page). A value
    the code no longer knows can still be filtered on through the URL (``?field=value``)."""

    class KnownValuesFilter(admin.SimpleListFilter):
        parameter_name = field

        def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
            return [(value, value) for value in sorted(set(values())) if value]

        def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
            value = self.value()
            return queryset.filter(**{field: value}) if value else queryset

    KnownValuesFilter.title = title
    KnownValuesFilter.__name__ = f"KnownValuesFilter_{field}"
    return KnownValuesFilter


def workflow_states() -> list[str]:
    """Every state of every workflow agents may follow: the code's, and the latest version of each one
    declared in the admin (a filter of checkpoints or sessions by state offers them all)."""
    return [state for name, _title in workflow_choices() for state in get_workflow(name).states]
