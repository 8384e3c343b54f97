"""Small helpers around the app's connections: the database's, and a local Redis for the broker."""

from __future__ import annotations

import socket
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from typing import Any, TypeVar

from django.db import connection, connections, transaction
from django.db.backends.postgresql.psycopg_any import BaseTzLoader
from django.db.models import Model, QuerySet
from psycopg import DataError
from psycopg.types.datetime import DateLoader, TimestampLoader

from core.incoming import EARLIEST, LATEST

M = TypeVar("M", bound=Model)


def database_url(name: str | None = None) -> str:
    """A ``DATABASE_URL`` for the database this process uses (or database ``name`` on the same server),
    for processes it starts: test workers and servers, benchmark servers."""
    s = connections["default"].settings_dict
    url = f"postgresql://{s['USER']}:{s['PASSWORD']}@/{name or s['NAME']}?host={s['HOST']}"
    return url + (f"&port={s['PORT']}" if s.get("PORT") else "")


def redis_reachable(host: str = "127.0.0.1", port: int = 6379) -> bool:
    """Does a Redis answer PING at ``host:port`` within half a second?"""
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def reconnect_if_broken() -> bool:
    """Close this thread's connection if an error left it dead, so the next query opens a new one.

    Django replaces a broken connection only between requests (or when a transaction's rollback fails);
    a long request (a turn waiting on a model) whose connection was cut must do it itself. Outside a
    transaction only: inside one, the caller's work is lost anyway and must fail. Returns whether it closed.
    """
    if connection.connection is None or connection.in_atomic_block or not connection.errors_occurred:
        return False
    if connection.is_usable():
        connection.errors_occurred = False
        return False
    connection.close()
    return True


def update_returning(queryset: QuerySet[M], **values: Any) -> list[M]:
    """``queryset.update(**values)`` that also returns the rows as written: one ``UPDATE … RETURNING``
    statement where an update and a re-read took two.

    ``values`` are what ``update`` takes (values, ``F()``, ``Case``, subqueries). The instances carry
    every concrete field through the fields' database converters, as a query's would; no relation is
    cached on them.
    """
    model = queryset.model
    compiler, text, params = _update_compiled(queryset, values)
    fields = model._meta.concrete_fields
    qn = compiler.connection.ops.quote_name
    table = model._meta.db_table
    text += " RETURNING " + ", ".join(f"{qn(table)}.{qn(f.column)}" for f in fields)
    with transaction.mark_for_rollback_on_error(using=queryset.db), compiler.connection.cursor() as cursor:
        cursor.execute(text, params)
        rows: Any = cursor.fetchall()
    return instances_from_rows(model, rows, using=queryset.db)


def select_columns(model: type[Model], alias: str) -> str:
    """The model's concrete columns, qualified by ``alias``, in the order ``instances_from_rows`` reads them."""
    qn = connection.ops.quote_name
    return ", ".join(f"{alias}.{qn(f.column)}" for f in model._meta.concrete_fields)


_converters: dict[tuple[type[Model], str], list[tuple[Any, list[Any]]]] = {}


def instances_from_rows(model: type[M], rows: Iterable[Sequence[Any]], *, using: str = "default") -> list[M]:
    """Instances of ``model`` from rows of its concrete columns in field order (``select_columns``), through
    the backend's and the fields' database converters (a JSON field's text parsed), as a query's would be.
    The converters are looked up once per model."""
    conn = connections[using]
    fields: Any = model._meta.concrete_fields
    if (model, using) not in _converters:
        cols = [f.get_col(model._meta.db_table) for f in fields]
        _converters[(model, using)] = [
            (col, conn.ops.get_db_converters(col) + f.get_db_converters(conn))
            for f, col in zip(fields, cols, strict=True)
        ]
    converters = _converters[(model, using)]
    names = [f.attname for f in fields]
    out = []
    for row in rows:
        values = list(row)
        for i, (col, functions) in enumerate(converters):
            for function in functions:
                values[i] = function(values[i], col, conn)
        out.append(model.from_db(using, names, values))
    return out


def _update_compiled(queryset: QuerySet[Any], values: dict[str, Any]) -> tuple[Any, str, Any]:
    from django.db.models import sql

    query: Any = queryset.query.chain(sql.UpdateQuery)
    query.add_update_values(values)
    query.clear_select_clause()
    compiler = query.get_compiler(queryset.db)
    text, params = compiler.as_sql()
    if not text:
        raise ValueError("an update needs at least one value to set")
    return compiler, text, params


def update_sql(queryset: QuerySet[Any], **values: Any) -> tuple[str, list[Any]]:
    """The ``UPDATE`` statement (text, positional parameters) that ``queryset.update(**values)`` would run: to
    be the first part of a statement that does more (a CTE whose ``RETURNING`` the rest reads)."""
    _compiler, text, params = _update_compiled(queryset, values)
    return text, list(params)


def refresh_from(instance: M, fresh: M) -> M:
    """Copy every concrete field of ``fresh`` (the same row, read or returned later) onto ``instance``.

    What ``refresh_from_db`` does with a row already in hand: a cached relation stays when its id is
    unchanged and goes when it changed, and relations cached on ``fresh`` are taken over.
    """
    if type(instance) is not type(fresh) or instance.pk != fresh.pk:
        raise ValueError("refresh_from copies a row onto a copy of the same row")
    field: Any
    for field in instance._meta.concrete_fields:
        setattr(instance, field.attname, getattr(fresh, field.attname))
        if field.is_relation and field.is_cached(fresh):
            field.set_cached_value(instance, field.get_cached_value(fresh))
    instance._state.db = fresh._state.db
    instance._state.adding = False
    return instance


def dates_read_within_bounds(*, sender: Any = None, connection: Any, **kwargs: Any) -> None:
    """On each new connection (Django's ``connection_created``): a date or time that Python cannot hold (before
    year 1 in UTC, after 9999, ``±infinity``, all of which PostgreSQL stores) is read as the nearest one the
    app takes (``core.incoming.EARLIEST`` / ``LATEST``) instead of failing the query.

    Every door refuses such dates (``core.incoming``), but a row may hold one all the same (written by an
    older version, by hand, by another program); read as an error, it made every list that showed it, its
    owner's export and their erasure fail. Dates Python holds are read exactly as before."""
    if connection.vendor != "postgresql" or not hasattr(connection.connection, "adapters"):
        return

    def bounded(text: bytes) -> datetime:
        text = text.strip()
        return EARLIEST if text.startswith(b"-") or text.endswith(b"BC") else LATEST

    class BoundedTzLoader(BaseTzLoader):
        # Django keeps a connection's loader when its timezone is the connection's (``create_cursor``).
        timezone = connection.timezone

        def load(self, data: Any) -> datetime:
            try:
                return super().load(data)
            except DataError:
                return bounded(bytes(data)).astimezone(self.timezone)

    class BoundedLoader(TimestampLoader):  # timestamp: what DATE_TRUNC gives (the admin's date hierarchy)
        def load(self, data: Any) -> datetime:
            try:
                return super().load(data)
            except DataError:
                return bounded(bytes(data)).replace(tzinfo=None)

    class BoundedDateLoader(DateLoader):
        def load(self, data: Any) -> date:
            try:
                return super().load(data)
            except DataError:
                return bounded(bytes(data)).date()

    adapters = connection.connection.adapters
    adapters.register_loader("timestamptz", BoundedTzLoader)
    adapters.register_loader("timestamp", BoundedLoader)
    adapters.register_loader("date", BoundedDateLoader)


def release_connection() -> None:
    """Give this thread's database connection back (to the pool, or closed) unless a transaction uses it: before
    a wait that needs none (a model's answer, a run's next event)."""
    if not connection.in_atomic_block:
        connection.close()
