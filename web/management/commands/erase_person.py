"""``manage.py erase_person --user NAME``: erase everything kept about one person (``people.erasure``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from people.erasure import person_erase
from sessions.locks import SessionBusyError


class Command(BaseCommand):
    help = "Erase a person's sessions, turns, memories and records (their account stays). Cannot be undone."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True, help="The username.")
        parser.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"No user is called {options['user']!r}.")
        if not options["yes"]:
            try:
                answer = input(f"Erase everything kept about {user.get_username()}? This cannot be undone. [y/N] ")
            except EOFError:  # no terminal to ask (a script, a pipe): never erase without a yes
                raise CommandError(
                    "Not erased: nothing answered the question. Pass --yes to erase without asking."
                ) from None
            if answer.strip().lower() not in ("y", "yes"):
                raise CommandError("Not erased.")
        try:
            result = person_erase(user=user, actor=None)
        except SessionBusyError as exc:
            raise CommandError(str(exc)) from exc
        listed = ", ".join(f"{name} {count}" for name, count in result.counts.items())
        self.stdout.write(self.style.SUCCESS(f"Erased the data of {user.get_username()}: {listed}."))
