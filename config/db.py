"""Small helpers around the app's connections: the database's, and a local Redis for the broker."""

from __future__ import annotations

import socket
from typing import Any, TypeVar

from django.db import connection, connections, transaction
from django.db.models import Model, QuerySet

M = TypeVar("M", bound=Model)


def database_url(name: str | None = None) -> str:
    """A ``DATABASE_URL`` for the database this process uses (or database ``name`` on the same server),
    for processes it starts: test workers and servers, benchmark servers."""
    s = connections["default"].settings_dict
    url = f"postgresql://{s['USER']}:{s['PASSWORD']}@/{name or s['NAME']}?host={s['HOST']}"
    return url + (f"&port={s['PORT']}" if s.get("PORT") else "")


def storable_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL and lone surrogates (from a JSON "\\ud800" escape) become
    U+FFFD; the two halves of a pair (escaped apart, "\\ud83d" and "\\ude00", as a stream can send them)
    become the one character they stand for. For text from outside that must not be refused: model
    output, tool results. (User input is refused instead, with a clear error:
    ``agents.runtime.validate_message``.)"""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Through UTF-16: a high surrogate followed by a low one decodes to their character, any other
        # surrogate to U+FFFD.
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def hold_high_surrogate(text: str) -> tuple[str, str]:
    """``text`` split before a high surrogate that ends it: (what can be shown now, what waits for the next
    piece). A stream may send the two halves of a character (an emoji) in two chunks; shown apart, each
    would be a lone surrogate, and ``storable_text`` would turn the character into two U+FFFD."""
    if text and "\ud800" <= text[-1] <= "\udbff":
        return text[:-1], text[-1]
    return text, ""


def storable_json(value: Any) -> Any:
    """``storable_text`` over every string (keys included) of a parsed JSON value: a JSON "\\u0000" escape
    parses to a NUL, which a jsonb column refuses as much as a text one."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_json(k): storable_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable_json(v) for v in value]
    return value


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
    from django.db.models import sql

    model = queryset.model
    query: Any = queryset.query.chain(sql.UpdateQuery)
    query.add_update_values(values)
    query.clear_select_clause()
    compiler = query.get_compiler(queryset.db)
    text, params = compiler.as_sql()
    if not text:
        raise ValueError("update_returning needs at least one value to set")
    fields = model._meta.concrete_fields
    qn = compiler.connection.ops.quote_name
    table = model._meta.db_table
    text += " RETURNING " + ", ".join(f"{qn(table)}.{qn(f.column)}" for f in fields)
    with transaction.mark_for_rollback_on_error(using=queryset.db), compiler.connection.cursor() as cursor:
        cursor.execute(text, params)
        rows: Any = cursor.fetchall()
    converters = compiler.get_converters([f.get_col(table) for f in fields])
    if converters:
        rows = compiler.apply_converters(rows, converters)
    names = [f.attname for f in fields]
    return [model.from_db(queryset.db, names, row) for row in rows]


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
