from __future__ import annotations

from django.apps import AppConfig


class BookingExampleConfig(AppConfig):
    name = "examples.booking"
    label = "booking_example"
    verbose_name = "Flight-booking example"

    def ready(self) -> None:
        # Teach the offline demo model the booking workflow, so it can be walked end to end with no LLM.
        from examples.booking.demo import register

        register()
