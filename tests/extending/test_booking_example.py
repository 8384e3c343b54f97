"""The booking example owns its model, its agent and its part of erasure, through the hooks a package of yours
would use: ``AGENT_SEEDS`` and ``PERSON_ERASERS`` (docs/extending.md), with a clear error for a bad entry."""

from __future__ import annotations

import importlib
from datetime import date
from typing import Any

import pytest
from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from agents.models import Agent, Erasure
from agents.services import configured_agent_seeds, default_agents_ensure
from agents.tools.registry import Tool, default_registry
from examples.booking import tools as booking_tools
from examples.booking.models import Booking
from people.erasure import configured_erasers, person_erase

ERASED: list[Any] = []


def fake_eraser(user: Any) -> dict[str, int]:
    """A package's eraser, as PERSON_ERASERS names it: records who it was called for."""
    ERASED.append(user.pk)
    return {"widgets": 3}


def wrong_eraser(user: Any) -> Any:
    Booking.objects.filter(user=user).delete()
    return ["not", "counts"]


def _book(user: Any, session: Any = None, *, reference: str) -> Booking:
    return Booking.objects.create(
        user=user,
        session=session,
        reference=reference,
        flight_number="QK1234",
        origin="Paris",
        destination="Rome",
        depart_date=date(2030, 5, 1),
        passengers=1,
    )


# --- the model ------------------------------------------------------------------------------------------------


def test_the_booking_model_is_the_examples_on_the_table_it_always_had() -> None:
    assert Booking._meta.app_label == "booking_example"
    assert Booking._meta.db_table == "agents_booking"
    assert apps.get_model("booking_example", "Booking") is Booking
    with pytest.raises(LookupError):
        apps.get_model("agents", "Booking")


@pytest.mark.django_db
def test_the_table_and_the_content_type_are_the_examples() -> None:
    assert "agents_booking" in connection.introspection.table_names()
    content_type = ContentType.objects.get_for_model(Booking)
    assert (content_type.app_label, content_type.model) == ("booking_example", "booking")
    assert not ContentType.objects.filter(app_label="agents", model="booking").exists()


@pytest.mark.django_db
def test_the_migration_moves_the_content_type_row_and_back() -> None:
    migration = importlib.import_module("examples.booking.migrations.0001_initial")
    ContentType.objects.clear_cache()
    try:
        row = ContentType.objects.get(app_label="booking_example", model="booking")
        row.app_label = "agents"
        row.save()  # as a database from before the move has it
        migration.content_type_forward(apps, None)
        row.refresh_from_db()
        assert row.app_label == "booking_example"
        migration.content_type_backward(apps, None)
        row.refresh_from_db()
        assert row.app_label == "agents"
        migration.content_type_forward(apps, None)
        row.refresh_from_db()
        assert row.app_label == "booking_example"
    finally:
        ContentType.objects.clear_cache()


# --- the tools ------------------------------------------------------------------------------------------------


def test_the_shipped_tools_are_made_with_the_decorator_under_their_old_names_too() -> None:
    from agents.tools import web
    from memory import tools as memory_tools

    assert booking_tools.SEARCH_FLIGHTS is booking_tools.search_flights
    assert booking_tools.BOOK_FLIGHT is booking_tools.book_flight
    assert web.HTTP_GET is web.http_get and memory_tools.SEARCH_MEMORY is memory_tools.search_memory
    for found in (booking_tools.search_flights, booking_tools.book_flight, web.http_get, memory_tools.search_memory):
        assert isinstance(found, Tool)
        assert default_registry().get(found.name) is found


# --- the seed -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_seed_hook_creates_the_booking_agent() -> None:
    assert [seed["slug"] for seed in configured_agent_seeds()] == ["assistant", "flight-booking"]
    seeded = {agent.slug: agent for agent in default_agents_ensure()}
    assert set(seeded) == {"assistant", "flight-booking"}
    booking = Agent.objects.get(slug="flight-booking")
    assert booking.workflow == "flight_booking" and booking.tools == ["search_flights"]
    assert "book_flight" in booking.system_prompt
    booking.name = "Renamed by an operator"
    booking.save()
    default_agents_ensure()  # again: nothing is overwritten, nothing doubled
    assert Agent.objects.get(slug="flight-booking").name == "Renamed by an operator"
    assert Agent.objects.filter(slug="flight-booking").count() == 1


@pytest.mark.django_db
def test_without_the_seed_the_product_seeds_only_its_own_agent(settings: Any) -> None:
    settings.AGENT_SEEDS = []
    assert [agent.slug for agent in default_agents_ensure()] == ["assistant"]
    assert not Agent.objects.filter(slug="flight-booking").exists()


def test_a_seed_may_be_a_dict_or_a_list(settings: Any) -> None:
    settings.AGENT_SEEDS = ["tests.extending.test_booking_example.ONE_SEED", "tests.extending.test_booking_example.TWO"]
    assert [seed["slug"] for seed in configured_agent_seeds()] == ["assistant", "one", "two-a", "two-b"]


ONE_SEED = {"slug": "one", "name": "One"}
TWO = [{"slug": "two-a", "name": "Two A"}, {"slug": "two-b", "name": "Two B"}]
NO_SLUG = {"name": "Nameless"}
NOT_A_FIELD = {"slug": "odd", "colour": "blue"}


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("examples.booking.seed.no_such_seed", "AGENT_SEEDS: cannot import 'examples.booking.seed.no_such_seed'"),
        ("examples.booking.seed.BOOKING_PROMPT", "is str, not an agent seed"),
        ("tests.extending.test_booking_example.NO_SLUG", "a seed has no slug"),
        ("tests.extending.test_booking_example.NOT_A_FIELD", "'colour' is not a field of Agent"),
        ("examples.booking.seed.flight_booking_agent", "more than one agent seed has the slug 'flight-booking'"),
    ],
)
def test_a_bad_seed_entry_is_improperly_configured_naming_it(settings: Any, path: str, message: str) -> None:
    settings.AGENT_SEEDS = [*settings.AGENT_SEEDS, path]
    with pytest.raises(ImproperlyConfigured, match=message.replace("(", r"\(").replace(".", r"\.")):
        configured_agent_seeds()


# --- erasure --------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_erasure_hook_deletes_the_persons_bookings_and_counts_them(
    alice: Any, bob: Any, booking_session: Any
) -> None:
    _book(alice, booking_session, reference="AAA111")
    _book(alice, reference="AAA222")
    _book(bob, reference="BBB111")
    result = person_erase(user=alice)
    assert result.counts["bookings"] == 2 and result.counts["sessions"] == 1
    assert Erasure.objects.get(pk=result.erasure_id).counts["bookings"] == 2
    assert not Booking.objects.filter(user=alice).exists()
    assert list(Booking.objects.values_list("reference", flat=True)) == ["BBB111"]  # another's stay
    assert person_erase(user=alice).counts["bookings"] == 0


@pytest.mark.django_db
def test_an_eraser_named_in_the_settings_is_called_and_its_counts_joined(settings: Any, alice: Any) -> None:
    ERASED.clear()
    _book(alice, reference="AAA111")
    settings.PERSON_ERASERS = ["tests.extending.test_booking_example.fake_eraser"]
    counts = person_erase(user=alice).counts
    assert ERASED == [alice.pk]
    assert counts["widgets"] == 3 and "bookings" not in counts
    assert Booking.objects.filter(user=alice).count() == 1  # the booking eraser is not listed: it did not run
    settings.PERSON_ERASERS = [
        "examples.booking.erasure.bookings_erase",
        "tests.extending.test_booking_example.fake_eraser",
    ]
    counts = person_erase(user=alice).counts
    assert counts["bookings"] == 1 and counts["widgets"] == 3 and len(ERASED) == 2


@pytest.mark.django_db
def test_an_eraser_that_does_not_return_counts_stops_the_erasure(settings: Any, alice: Any) -> None:
    _book(alice, reference="AAA111")
    settings.PERSON_ERASERS = ["tests.extending.test_booking_example.wrong_eraser"]
    with pytest.raises(TypeError, match="wrong_eraser returned"):
        person_erase(user=alice)
    assert Booking.objects.filter(user=alice).count() == 1  # rolled back
    assert not Erasure.objects.exists()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("examples.booking.erasure.no_such_eraser", "PERSON_ERASERS: cannot import"),
        ("examples.booking.seed.BOOKING_PROMPT", "is str, not a callable"),
        ("no_such_package.erase", "cannot import 'no_such_package.erase'"),
    ],
)
@pytest.mark.django_db
def test_a_misconfigured_eraser_path_is_improperly_configured_and_erases_nothing(
    settings: Any, alice: Any, path: str, message: str
) -> None:
    _book(alice, reference="AAA111")
    settings.PERSON_ERASERS = [path]
    with pytest.raises(ImproperlyConfigured, match=message):
        configured_erasers()
    with pytest.raises(ImproperlyConfigured, match=message):
        person_erase(user=alice)
    assert Booking.objects.filter(user=alice).count() == 1 and not Erasure.objects.exists()
