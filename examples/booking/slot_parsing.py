"""Read booking slot values out of a user's words, for the offline demo model.

A real model fills the slots itself; the demo model has no understanding, so it uses these parsers:
``dateparser`` for dates ("March 10-15", "next Friday", "2027-01-05"), number words for passengers,
and "from X to Y" patterns for places. What they return is validated by the workflow like a model's
answer would be, so a wrong guess is refused, never stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any

import dateparser

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|jun(?:e)?|jul(?:y)?|aug(?:ust)?|"
    r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_WEEKDAY = r"(?:mon|tues?|wed(?:nes)?|thu(?:rs?)?|fri|sat(?:ur)?|sun)(?:day)?"
_ORD = r"(?:st|nd|rd|th)?"
_NUMBER_WORDS = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "a couple of": 2,
}
_NUM = r"(?:\d{1,2}|one|two|three|four|five|six|seven|eight|nine)"

# A date range in one phrase: "March 10-15", "March 10 to March 15", "10-15 March".
_RANGE_MONTH_FIRST = re.compile(
    rf"\b(?P<m1>{_MONTH})\.?\s+(?P<d1>\d{{1,2}}){_ORD}\s*(?:-|–|—|to|until|till|through|thru)\s*"
    rf"(?:(?P<m2>{_MONTH})\.?\s+)?(?P<d2>\d{{1,2}}){_ORD}\b",
    re.IGNORECASE,
)
_RANGE_DAY_FIRST = re.compile(
    rf"\b(?P<d1>\d{{1,2}}){_ORD}\s*(?:-|–|—|to|until|till)\s*(?P<d2>\d{{1,2}}){_ORD}\s+(?:of\s+)?(?P<m1>{_MONTH})\b",
    re.IGNORECASE,
)
# Single date phrases, in the order they are tried; each match is handed to dateparser.
_DATE_PHRASES = re.compile(
    "|".join(
        [
            r"\b\d{4}-\d{2}-\d{2}\b",
            rf"\b{_MONTH}\.?\s+\d{{1,2}}{_ORD}(?:,?\s+\d{{4}})?\b",
            rf"\b\d{{1,2}}{_ORD}\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?\b",
            r"\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b",
            rf"\b(?:next|this|coming)\s+{_WEEKDAY}\b",
            rf"\b{_WEEKDAY}\b",
            r"\b(?:today|tomorrow|day after tomorrow)\b",
            r"\bin\s+(?:\d+|a|one|two|three|four|five|six)\s+(?:days?|weeks?)\b",
            r"\bnext\s+week\b",
        ]
    ),
    re.IGNORECASE,
)
_RETURN_MARKER = re.compile(r"\b(?:return(?:ing)?|back|coming back|until|till)\b", re.IGNORECASE)

_PASSENGERS = re.compile(
    rf"\b(?P<n>{_NUM}|a couple of)\s+(?:passengers?|people|persons?|adults?|travell?ers?|tickets?|seats?|of us|pax)\b",
    re.IGNORECASE,
)
# "250 passengers": read (and refused by the workflow with its reason) rather than ignored. Only with a word
# for people: "EUR 180 seats left" in a timetable is not a party of 180.
_MANY_PASSENGERS = re.compile(r"\b(?P<n>\d{3,4})\s+(?:passengers?|people|persons?|travell?ers?|pax)\b", re.IGNORECASE)
_PASSENGERS_LEAD = re.compile(
    rf"\b(?:party of|group of|we are|we're|there are|there will be|for)\s+(?P<n>{_NUM})\b"
    rf"(?!\s*(?:{_MONTH}|days?|nights?|weeks?|hours?|/|-|st\b|nd\b|rd\b|th\b))",
    re.IGNORECASE,
)
_SOLO = re.compile(r"\b(?:just me|only me|myself|alone|solo|by myself|one person)\b", re.IGNORECASE)
_PAIR = re.compile(r"\b(?:me and my \w+|my \w+ and (?:i|me)|the two of us|both of us)\b", re.IGNORECASE)
_BARE_NUMBER = re.compile(rf"^\s*(?:just\s+|only\s+)?(?P<n>{_NUM})\s*[.!]?\s*$", re.IGNORECASE)

# A place: words made of letters (and . ' -), stopping before a word that starts the next phrase.
_STOP = (
    r"on|in|at|for|next|this|coming|departing|leaving|returning|return|with|between|and|from|to|by|"
    r"around|please|tomorrow|today|via|then|instead|rather|than|but|not|" + _MONTH + "|" + _WEEKDAY
)
_PLACE = rf"(?P<{{name}}>[^\W\d_][\w.'-]*(?:\s+(?!(?:{_STOP})\b)[^\W\d_][\w.'-]*){{{{0,3}}}})"
_FROM_TO = re.compile(
    r"\bfrom\s+" + _PLACE.format(name="origin") + r"\s+to\s+" + _PLACE.format(name="destination"),
    re.IGNORECASE,
)
_TO_FROM = re.compile(
    r"\bto\s+" + _PLACE.format(name="destination") + r"\s+from\s+" + _PLACE.format(name="origin"),
    re.IGNORECASE,
)
_FROM = re.compile(r"\b(?:from|leaving|departing|out of)\s+" + _PLACE.format(name="origin"), re.IGNORECASE)
_TO = re.compile(r"\b(?:to|for|into)\s+" + _PLACE.format(name="destination"), re.IGNORECASE)
# Words after "to" that are verbs or filler, not places ("I want to fly to Paris").
_NOT_PLACES = frozenset(
    """fly flying go going travel book booking get make change start be see know have do the a an my our it
    that this me us you them leave depart return come visit find check confirm cancel say ask speak talk
    take pay help continue resume stop keep yes yeah yep no nope ok okay sure hi hello hey thanks thank please
    sorry what why how when where who anywhere somewhere nowhere""".split()
)
# Words of a sentence, not of a place name: a bare answer with one of them is not a place ("I'm not sure
# yet" was taken as the origin, "I don't want to book this" as "I don't want to").
_NOT_IN_A_BARE_PLACE = _NOT_PLACES | frozenset(
    """i i'm im i'd id i'll we we're we'd not don't dont didn't can't cannot won't isn't want wanna would like
    yet idea maybe later unsure decided decide think thinking guess to is are was any anything nothing
    something whatever either neither""".split()
)
_BARE_PLACE = re.compile(
    r"^\s*(?:(?:i'?m\s+|we'?re\s+)?(?:in|at|from|to)\s+)?(?P<place>[^\W\d_][\w .'-]{1,79}?)\s*,?\s*(?:please)?\s*[.!]?\s*$",
    re.IGNORECASE,
)
_STOP_WORD = re.compile(rf"^(?:{_STOP})$", re.IGNORECASE)


def parse_date_phrase(text: str, *, today: date) -> date | None:
    """One date phrase ("next Friday", "March 10", "2027-01-05") as a date on or after ``today``."""
    parsed = dateparser.parse(
        text,
        languages=["en"],
        settings={
            "PREFER_DATES_FROM": "future",
            "RELATIVE_BASE": datetime(today.year, today.month, today.day),
            "RETURN_AS_TIMEZONE_AWARE": False,
            "PREFER_DAY_OF_MONTH": "first",
        },
    )
    return parsed.date() if parsed else None


def extract_dates(text: str, *, today: date) -> dict[str, str]:
    """``depart_date`` (and ``return_date``) in ISO form from a message, or {}."""
    for pattern in (_RANGE_MONTH_FIRST, _RANGE_DAY_FIRST):
        match = pattern.search(text)
        if match:
            month1 = match.group("m1")
            month2 = match.groupdict().get("m2") or month1
            first = parse_date_phrase(f"{month1} {match.group('d1')}", today=today)
            second = parse_date_phrase(f"{month2} {match.group('d2')}", today=first or today)
            if first:
                found = {"depart_date": first.isoformat()}
                if second and second >= first:
                    found["return_date"] = second.isoformat()
                return found
    dates: list[tuple[int, date]] = []
    for match in _DATE_PHRASES.finditer(text):
        parsed = parse_date_phrase(match.group(0), today=today)
        if parsed:
            dates.append((match.start(), parsed))
    if not dates:
        return {}
    found = {"depart_date": dates[0][1].isoformat()}
    if len(dates) > 1 and dates[1][1] >= dates[0][1]:
        found["return_date"] = dates[1][1].isoformat()
    elif (
        len(dates) == 1
        and _RETURN_MARKER.search(text[: dates[0][0]])
        and not re.search(r"\b(?:depart|leav|go|fly)", text[: dates[0][0]], re.IGNORECASE)
    ):
        # "returning on the 15th" alone is a return date, not a new departure.
        return {"return_date": dates[0][1].isoformat()}
    return found


def _number(word: str) -> int | None:
    word = word.strip().lower()
    if word.isdigit():
        return int(word)
    return _NUMBER_WORDS.get(word)


def extract_passengers(text: str, *, bare_answer: bool = False) -> int | None:
    """The number of travellers ("2 adults", "three of us", "just me"); a bare "2" only when ``bare_answer``."""
    for pattern in (_PASSENGERS, _MANY_PASSENGERS, _PASSENGERS_LEAD):
        match = pattern.search(text)
        if match:
            return _number(match.group("n"))
    if _SOLO.search(text):
        return 1
    if _PAIR.search(text):
        return 2
    if bare_answer:
        match = _BARE_NUMBER.match(text)
        if match:
            return _number(match.group("n"))
    return None


def _clean_place(raw: str) -> str | None:
    words = raw.strip(" .,'-").split()
    while words and words[-1].lower() in _NOT_PLACES:
        words.pop()
    if not words or words[0].lower() in _NOT_PLACES or _STOP_WORD.match(words[0]):
        return None
    place = " ".join(words)
    # "new york" → "New York"; keep what the user capitalised themselves ("LHR", "ldn").
    return place.title() if place.islower() and len(place) > 3 else place


def extract_places(text: str, *, bare: str = "") -> dict[str, str]:
    """``origin``/``destination`` from "from X to Y", "to Y from X", "from X", "to Y"; a bare "Paris" fills
    the slot named by ``bare`` (the one the agent just asked for)."""
    found: dict[str, str] = {}
    for pattern in (_FROM_TO, _TO_FROM):
        match = pattern.search(text)
        if match:
            for slot in ("origin", "destination"):
                place = _clean_place(match.group(slot))
                if place:
                    found[slot] = place
            if found:
                return found
    match = _FROM.search(text)
    if match and (place := _clean_place(match.group("origin"))):
        found["origin"] = place
    for match in _TO.finditer(text):
        place = _clean_place(match.group("destination"))
        if place:
            found["destination"] = place
            break
    if not found and bare:
        match = _BARE_PLACE.match(text)
        if match and not _DATE_PHRASES.search(text) and not re.search(r"\d", text):
            place = _clean_place(match.group("place"))
            words = [w.lower().strip(".,!?") for w in match.group("place").split()]
            if place and len(place.split()) <= 4 and not any(w in _NOT_IN_A_BARE_PLACE for w in words):
                found[bare] = place
    return found


# "make that Rome instead of Paris", "Rome instead of Paris", "not Paris but Rome", "Paris → Rome".
_INSTEAD = re.compile(
    r"(?:\b(?:make (?:that|it)|change (?:that|it) to|switch to|rather)\s+)?"
    + _PLACE.format(name="new")
    + r"\s+instead of\s+"
    + _PLACE.format(name="old"),
    re.IGNORECASE,
)
_NOT_BUT = re.compile(
    r"\bnot\s+" + _PLACE.format(name="old") + r",?\s+but\s+" + _PLACE.format(name="new"), re.IGNORECASE
)
_RATHER_THAN = re.compile(_PLACE.format(name="new") + r"\s+rather than\s+" + _PLACE.format(name="old"), re.IGNORECASE)


def _without_lead(raw: str) -> str:
    """``raw`` without the words before a place ("go to Paris" → "Paris"): a correction's new place is matched
    from wherever the sentence starts."""
    words = raw.split()
    while words and (words[0].lower() in _NOT_IN_A_BARE_PLACE or _STOP_WORD.match(words[0])):
        words.pop(0)
    return " ".join(words)


def extract_correction(text: str, current: Mapping[str, Any]) -> dict[str, str]:
    """A stated change of a place already collected ("make that Rome instead of Paris"): the slot whose value
    is the old place gets the new one. {} when the message names no such change, or no slot holds the old
    place: then "to Paris instead of Berlin" is read as any other message ("to Paris": places stop before
    "instead", "rather", "but", "not")."""
    for pattern in (_INSTEAD, _RATHER_THAN, _NOT_BUT):
        match = pattern.search(text)
        if not match:
            continue
        old, new = _clean_place(match.group("old")), _clean_place(_without_lead(match.group("new")))
        if not old or not new:
            continue
        for slot in ("origin", "destination"):
            if str(current.get(slot) or "").lower() == old.lower():
                return {slot: new}
    return {}


# A day that no month has, or not that month ("31st of February", "February 30"): said back, not ignored.
_DAY_MONTH = re.compile(rf"\b(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<m>{_MONTH})\b", re.IGNORECASE)
_MONTH_DAY = re.compile(rf"\b(?P<m>{_MONTH})\.?\s+(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\b", re.IGNORECASE)
_MONTH_NUMBERS = {
    name[:3]: index
    for index, name in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], start=1
    )
}


def impossible_date(text: str, *, today: date) -> str | None:
    """ "YYYY-MM-DD" of a stated day that does not exist ("31st of February" → "2027-02-31"), for the workflow to
    refuse with its reason; None when every stated day exists."""
    for pattern in (_DAY_MONTH, _MONTH_DAY):
        for match in pattern.finditer(text):
            day, month = int(match.group("d")), _MONTH_NUMBERS[match.group("m")[:3].lower()]
            year = today.year + (1 if month < today.month else 0)
            try:
                date(year, month, day)
            except ValueError:
                return f"{year:04d}-{month:02d}-{day:02d}"
    return None


# A flight number from the timetable ("QK7431", "flight qk 7431"): two letters and 3 or 4 digits. In capitals
# alone, or after the word "flight" in any case ("at 1400" is a time, not a flight).
_FLIGHT = re.compile(r"\b(?P<code>[A-Z]{2}\d{3,4})\b")
_FLIGHT_NAMED = re.compile(r"\bflight\s+(?P<code>[a-z]{2}\s?\d{3,4})\b", re.IGNORECASE)


def extract_flight_number(text: str) -> str | None:
    """The flight number a message names ("book QK7431 instead"), upper case and without spaces; else None."""
    match = _FLIGHT_NAMED.search(text) or _FLIGHT.search(text)
    return re.sub(r"\s+", "", match.group("code")).upper() if match else None


def extract_slots(
    text: str, *, asking: tuple[str, ...] = (), today: date, current: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Every booking slot this message states. ``asking`` names the slots the agent just asked for, so a
    bare answer ("Paris", "2") can be read as that slot; ``current`` (what is collected) lets a correction
    ("Rome instead of Paris") name the slot by its old value."""
    found: dict[str, Any] = {}
    correction = extract_correction(text, current or {})
    if correction:
        found.update(correction)
    else:
        bare_place = next((s for s in asking if s in ("origin", "destination")), "")
        found.update(extract_places(text, bare=bare_place))
    found.update(extract_dates(text, today=today))
    if "depart_date" not in found and (impossible := impossible_date(text, today=today)):
        found["depart_date"] = impossible
    passengers = extract_passengers(text, bare_answer="passengers" in asking)
    if passengers is not None:
        found["passengers"] = passengers
    flight = extract_flight_number(text)
    if flight is not None:
        found["flight_number"] = flight
    return found
