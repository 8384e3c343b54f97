"""The booking example's own data: the flights ``book_flight`` books.

The table keeps the name it had when the model lived in the agents app (``agents_booking``): moving the model
into the example changed only where Django reads it from (state-only migrations), not the data.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Booking(models.Model):
    """A flight booked by the ``book_flight`` tool (local data: no airline is called)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="bookings")
    session = models.ForeignKey(
        "chat_sessions.ChatSession", null=True, blank=True, on_delete=models.SET_NULL, related_name="bookings"
    )
    reference = models.CharField(max_length=12, unique=True)
    flight_number = models.CharField(max_length=12)
    origin = models.CharField(max_length=80)
    destination = models.CharField(max_length=80)
    depart_date = models.DateField()
    return_date = models.DateField(null=True, blank=True)
    passengers = models.PositiveSmallIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "agents_booking"
        ordering = ["-created_at"]
        constraints = [
            # A booking tool retried after a lost reply must not book twice for one session.
            models.UniqueConstraint(
                fields=["session", "flight_number", "depart_date"], name="booking_once_per_session_flight"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reference} {self.origin}→{self.destination} {self.depart_date}"
