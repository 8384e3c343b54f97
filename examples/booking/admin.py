"""The bookings ``book_flight`` made, for staff: each with the session (the branch of its chat) it was made on, so
that a chat branched before a booking and booked again on the branch shows both bookings, each with its branch."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from examples.booking.models import Booking


@admin.register(Booking)
class BookingAdmin(admin.ModelAdmin):
    list_display = ("reference", "user", "route", "depart_date", "passengers", "session_link", "branch", "created_at")
    list_select_related = ("user", "session")
    search_fields = ("reference", "user__username", "=session__id")
    readonly_fields = [f.name for f in Booking._meta.fields]

    @admin.display(description="route")
    def route(self, obj: Booking) -> str:
        return f"{obj.origin} → {obj.destination}"

    @admin.display(description="session")
    def session_link(self, obj: Booking) -> str:
        if obj.session_id is None:
            return "—"
        url = reverse("admin:chat_sessions_chatsession_change", args=[obj.session_id])
        return format_html('<a href="{}">{}</a>', url, str(obj.session))

    @admin.display(description="branch")
    def branch(self, obj: Booking) -> str:
        session = obj.session
        if session is None or session.chat_root is None:
            return "—"
        if session.parent_id is None:
            return format_html("the chat's first branch ({})", str(session.chat_id)[:8])
        return format_html("branched at turn #{} (chat {})", session.fork_seq, str(session.chat_id)[:8])

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False
