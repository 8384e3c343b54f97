"""The booking example's part of erasing a person: their bookings, plugged in through ``settings.PERSON_ERASERS``.

``people.erasure.person_erase`` calls it inside its transaction, after it has locked the person's sessions, and
joins the counts it returns to the erasure's ("bookings").
"""

from __future__ import annotations

from typing import Any

from examples.booking.models import Booking


def bookings_erase(user: Any) -> dict[str, int]:
    """Delete every booking of ``user``; how many, by name."""
    return {"bookings": Booking.objects.filter(user=user).delete()[0]}
