"""What comes in through any door, checked once: dates, whole numbers and text as PostgreSQL and Python can
both hold them. The API's serializers, the import, the MCP tools and the event stream call these, so one
value is taken or refused the same way whichever door it came through.

A refusal is an ``Unstorable``: a ``Refusal`` (the doors answer 400 with its message) and a ``ValueError``
(pydantic's validators and ``ValueError`` handlers take it as one), naming the field. Pure functions: no ORM.
"""

from __future__ import annotations

from datetime import UTC, datetime

from core.errors import Refusal

# PostgreSQL's timestamptz holds 4713 BC to 294276 AD, Python's datetime 1 to 9999 AD. A day inside the
# narrower: a date shown in any time zone (±14 hours) is still a date Python holds, and a few seconds or hours
# taken from it or added to it (a look-back, an expiry) do not overflow.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)

# PostgreSQL's integer (Django's IntegerField, PositiveIntegerField) and bigint (BigIntegerField, ids).
INT_MAX = 2**31 - 1
BIGINT_MAX = 2**63 - 1

# Turn.idempotency_key is 200 characters: a longer key cut there could collide with another.
IDEMPOTENCY_KEY_MAX = 200


class Unstorable(Refusal, ValueError):
    """A value outside what can be stored and read back. ``field`` names it ("" when the caller names it)."""

    code = "invalid"
    status = 400

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.reason = message


def storable_datetime(value: datetime, *, field: str = "") -> datetime:
    """``value`` in UTC when it lies between ``EARLIEST`` and ``LATEST``; a naive one is taken as UTC.
    ``Unstorable`` otherwise (``0001-01-01T00:00:00+14:00`` is 1 BC in UTC: PostgreSQL would store it and no
    Python could read it back)."""
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=UTC)
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not EARLIEST <= utc <= LATEST:
        raise Unstorable(
            f"the date must lie between {EARLIEST.date().isoformat()} and {LATEST.date().isoformat()} (UTC).",
            field=field,
        )
    return utc


def clamped_datetime(value: datetime) -> datetime:
    """``value`` in UTC, moved to ``EARLIEST`` or ``LATEST`` when it lies outside them: for a cursor (where a
    page's knowledge ends) rather than a date to store, where "before everything" is a fine answer."""
    try:
        return storable_datetime(value)
    except Unstorable:
        # Outside the range: a year in the first half of Python's is before it, any other after it.
        return EARLIEST if value.year < 5000 else LATEST


def storable_int(value: int, *, field: str = "", minimum: int = 0, maximum: int = INT_MAX) -> int:
    """``value`` when ``minimum <= value <= maximum`` (by default a non-negative PostgreSQL integer)."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise Unstorable(f"must be a whole number from {minimum:,} to {maximum:,}.", field=field)
    return value


def storable_str(value: str, *, field: str = "") -> str:
    """``value`` when PostgreSQL can store it: no NUL character, no lone surrogate (a JSON ``"\\ud800"``
    escape without its pair)."""
    if "\x00" in value:
        raise Unstorable("contains a NUL (\\u0000) character, which cannot be stored.", field=field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Unstorable(
            "contains characters that are not valid Unicode text (a lone surrogate).", field=field
        ) from None
    return value


def idempotency_key(value: str | None, *, field: str = "idempotency_key") -> str | None:
    """The key a retry is recognised by (surrounding spaces dropped; None when empty): 1 to
    ``IDEMPOTENCY_KEY_MAX`` printable characters. Refused rather than cut: two keys sharing their first 200
    characters would name the same turn."""
    key = (value or "").strip()
    if not key:
        return None
    if len(key) > IDEMPOTENCY_KEY_MAX or not key.isprintable():
        raise Unstorable(f"must be 1 to {IDEMPOTENCY_KEY_MAX} printable characters.", field=field)
    return key


def storable_value(value: object, *, field: str = "") -> object:
    """A parsed value (JSON's, a form's) with every string in it checked by ``storable_str`` (keys included)
    and every date by ``storable_datetime`` (returned in UTC); numbers are for the caller to bound, by the
    column they go to."""
    if isinstance(value, str):
        return storable_str(value, field=field)
    if isinstance(value, datetime):
        return storable_datetime(value, field=field)
    if isinstance(value, dict):
        return {storable_value(k, field=field): storable_value(v, field=field) for k, v in value.items()}
    if isinstance(value, list):
        return [storable_value(v, field=field) for v in value]
    return value
