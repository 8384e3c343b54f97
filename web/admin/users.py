"""People and their API tokens in the admin: Django's user admin with exporting and erasing a person's data as
actions (``PersonAdmin``), and DRF's token admin without the keys in plain text (``TokenKeyHiddenAdmin``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from rest_framework.authtoken.admin import TokenAdmin
from rest_framework.authtoken.models import TokenProxy

from people.erasure import person_erase
from sessions.locks import SessionBusyError
from web.admin.readonly import action_confirmation, refused_without
from web.api.agents import export_download

# What exporting and erasing a person reach: the data's own permissions, not only the user admin's.
EXPORT_PERMISSIONS = ("chat_sessions.view_chatsession", "chat_sessions.view_turn", "memory.view_memory")
ERASE_PERMISSIONS = ("chat_sessions.delete_chatsession", "memory.delete_memory")


class PersonAdmin(UserAdmin):
    """Django's user admin, with the erasure of a person's data (``people.erasure``) as an action."""

    actions = ["export_person", "erase_people"]  # (with the site-wide "delete selected")

    @admin.action(description="Export the selected person's data (JSON Lines)", permissions=["view"])
    def export_person(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponseBase | None:
        if refused_without(
            self, request, EXPORT_PERMISSIONS, "Exporting needs the view permissions on sessions, turns and memories."
        ):
            return None
        people = list(queryset[:2])
        if len(people) != 1:
            self.message_user(request, "Select one person to export.", level=messages.ERROR)
            return None
        return export_download(people[0])

    @admin.action(description="Erase everything kept about the selected people…", permissions=["change"])
    def erase_people(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        if refused_without(
            self, request, ERASE_PERMISSIONS, "Erasing needs the delete permissions on sessions and memories."
        ):
            return None
        people = list(queryset)
        if request.POST.get("confirmed") != "yes":
            return action_confirmation(
                self,
                request,
                "admin/auth/user/erase_confirmation.html",
                title="Erase everything kept about these people?",
                people=people,
            )
        erased = 0
        for person in people:
            try:
                person_erase(user=person, actor=request.user)
                erased += 1
            except SessionBusyError as exc:
                self.message_user(request, f"{person.get_username()}: not erased: {exc}", level=messages.ERROR)
        self.message_user(request, f"Erased the data of {erased} person(s); their accounts stay.")
        return None


class TokenKeyHiddenAdmin(TokenAdmin):
    """DRF's token admin without the keys in plain text: a key is a password to the user's data. The list and
    the token's page show its first four characters; the whole key is shown once, in the message after it
    is added (for staff to hand it over)."""

    list_display = ("key_hint", "user", "created")

    @admin.display(description="key")
    def key_hint(self, obj: Any) -> str:
        return f"{obj.key[:4]}…"

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        token = self.get_object(request, object_id)
        hint = {"subtitle": f"{token.key[:4]}… of {token.user}"} if token is not None else {}
        return super().change_view(request, object_id, form_url, {**hint, **(extra_context or {})})


if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)
admin.site.register(TokenProxy, TokenKeyHiddenAdmin)


User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)
admin.site.register(User, PersonAdmin)
