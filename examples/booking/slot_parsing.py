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
            # "the 20th" alone (a day of the month); "the 20th of January" is read whole above.
            rf"\bthe\s+\d{{1,2}}(?:st|nd|rd|th)\b(?!\s+(?:of\s+)?{_MONTH})(?!\s+(?:passengers?|people|of us))",
        ]
    ),
    re.IGNORECASE,
)
# "flying back on the 20th" is a return; "push it back to the 20th" is not.
_RETURN_MARKER = re.compile(
    r"\b(?:return(?:ing)?|(?:com(?:e|ing)|fly(?:ing)?|get(?:ting)?|head(?:ing)?|go(?:ing)?) back|back (?:on|home)|until|till)\b",
    re.IGNORECASE,
)

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
_SOLO = re.compile(r"\b(?:(?:just|only)(?: be)? me|myself|alone|solo|by myself|one person)\b", re.IGNORECASE)
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
    something whatever either neither that's thats it's its perfect fine great good right correct lovely nice
    sounds same said stick book one two three four five six seven eight nine""".split()
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
        and not re.search(r"\b(?:depart|leav|go|fly)(?!\w*\s+back)", text[: dates[0][0]], re.IGNORECASE)
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


# --- a change of mind ----------------------------------------------------------------------------------------
# Words people open a correction with ("Actually, …", "Sorry, I meant …", "Oh wait, make it …"), dropped before a
# place is read: "Actually Paris" is Paris.
_FILLER = (
    r"actually|sorry|oh|oops|wait|hmm+|um+|uh|ah|no|nope|well|ok(?:ay)?|so|hey|oh no|my bad|my mistake|"
    r"on second thoughts?|scratch that|hang on|hold on|i meant|i mean|i said|just|please|correction|change of plans?"
)
_LEAD = re.compile(rf"^(?:[\W_]*\b(?:{_FILLER})\b)+[\W_]*", re.IGNORECASE)
# Words that ask for a change: without one, a bare place in a message is not read as a new value.
_CHANGE_WORDS = re.compile(
    r"\b(?:actually|instead|rather|make (?:it|that)|change|switch|swap|replace|meant|mean|not|sorry|scratch|oops|"
    r"correction|go with|how about|what about|update|prefer|no wait|on second thought)\b",
    re.IGNORECASE,
)
# "make it Paris instead", "let's go with Paris", "how about Paris then", "can we do Paris": the new value alone.
_NEW_ALONE = re.compile(
    r"^(?:(?:can|could) (?:we|you|i) (?:please )?(?:do|make (?:it|that)|change (?:it|that) to|switch (?:it )?to|go with)\s+|"
    r"(?:let'?s|let us) (?:do|go with|make (?:it|that)|say|go for)\s+|"
    r"(?:make|change|switch) (?:it|that|this)(?: (?:to|into))?\s+|switch to\s+|change to\s+|go with\s+|"
    r"(?:how|what) about\s+|i'?d (?:rather|prefer)(?: to)?\s+|i prefer\s+|rather\s+)?"
    r"(?P<rest>.+?)"
    r"(?:[\s,]+(?:instead|then|rather|please|thanks|thank you|if possible|if that'?s ok(?:ay)?))*\s*[.!?]*\s*$",
    re.IGNORECASE,
)
# The old value said with the new one, in the orders people say it in.
_OLD_NEW = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"(?P<new>[^,.;!?]+?)\s*,?\s+(?:instead of|rather than|in place of)\s+(?P<old>[^,.;!?]+)",
        r"\b(?:instead of|rather than)\s+(?P<old>[^,.;!?]+?)\s*,\s*(?P<new>[^,.;!?]+)",
        r"\bnot\s+(?P<old>[^,.;!?]+?)\s*,?\s+but\s+(?P<new>[^,.;!?]+)",
        r"\bnot\s+(?P<old>[^,.;!?]+?)\s*[,;:-]+\s*(?P<new>[^,.;!?]+)",
        r"(?P<new>[^,.;!?]+?)\s*,?\s+not\s+(?P<old>[^,.;!?]+)",
        r"\b(?:change|switch|move)\s+(?:it\s+)?(?:from\s+)?(?P<old>[^,.;!?]+?)\s+(?:to|for|into)\s+(?P<new>[^,.;!?]+)",
        r"\b(?:swap|replace|switch)\s+(?P<old>[^,.;!?]+?)\s+(?:for|with|by)\s+(?P<new>[^,.;!?]+)",
        r"(?P<old>[^,.;!?→>]+?)\s*(?:→|->|=>)\s*(?P<new>[^,.;!?]+)",
    )
]
# A slot named by its name: "change the destination to Paris", "the departure city should be Leeds".
_SLOT_WORDS = (
    (
        "origin",
        r"origin|departure(?: city| airport| point)?|starting point|(?:city|airport) (?:i'?m |we'?re )?(?:leaving|flying) from",
    ),
    ("destination", r"destination|arrival(?: city| airport)?|(?:city|place) (?:i'?m |we'?re )?(?:going|flying) to"),
)
_NAMED_SLOT = [
    (
        slot,
        re.compile(
            rf"\b(?:the |my |our )?(?:{words})\s*(?:to|should be|is|will be|=|:|as|for)\s+(?:be\s+)?(?P<new>[^,.;!?]+)",
            re.IGNORECASE,
        ),
    )
    for slot, words in _SLOT_WORDS
]
_DIRECTION = re.compile(
    r"^(?:(?:fly(?:ing)?|go(?:ing)?|leav(?:e|ing)|depart(?:ing)?|head(?:ing)?)\s+)?(?P<dir>to|from|out of|into)\s+",
    re.I,
)
_LAST_DIRECTION = re.compile(r"\b(?P<dir>to|from|out of|into)\s+(?P<rest>(?:(?!\b(?:to|from|out of|into)\b).)+)$", re.I)


def _place_words(raw: str) -> str | None:
    """``raw`` as a place if it is one alone: no digits, no date, no word of a sentence, at most four words;
    else the place after its last "to" or "from" ("I'd like to go to Paris" is Paris)."""
    found = _place_alone(raw)
    if found is None:
        tail = _LAST_DIRECTION.search(raw)
        found = _place_alone(tail.group("rest")) if tail else None
    return found


def _place_alone(raw: str) -> str | None:
    raw = _LEAD.sub("", raw.strip())
    said_alone = _NEW_ALONE.match(raw)
    raw = _DIRECTION.sub("", said_alone.group("rest") if said_alone else raw)
    words = [w for w in raw.strip(" .,!?'\"").split() if w]
    while words and words[0].lower() in ("the", "a"):
        words.pop(0)
    if not words or len(words) > 4 or re.search(r"\d", raw) or _DATE_PHRASES.search(raw):
        return None
    if any(w.lower().strip(".,!?") in _NOT_IN_A_BARE_PLACE or _STOP_WORD.match(w) for w in words):
        return None
    return _clean_place(" ".join(words))


def _slot_holding(value: str, current: Mapping[str, Any]) -> str | None:
    value = value.lower()
    for slot in ("origin", "destination"):
        held = str(current.get(slot) or "").lower()
        if held and held == value:
            return slot
    return None


def _direction_of(raw: str) -> str | None:
    """ "origin" for a place said after "from" / "out of", "destination" after "to", else None."""
    match = _DIRECTION.match(_LEAD.sub("", raw.strip())) or _LAST_DIRECTION.search(raw)
    if not match:
        return None
    return "origin" if match.group("dir").lower() in ("from", "out of") else "destination"


def extract_correction(text: str, current: Mapping[str, Any]) -> dict[str, str]:
    """A change of a place already collected, in the words people use: {slot: new place}, or {}.

    - The old place with the new ("Paris instead of Berlin", "not Berlin but Paris", "Berlin → Paris", "change
      Berlin to Paris", "swap Berlin for Paris"): the slot that holds the old place gets the new one.
    - The slot by its name ("change the destination to Paris").
    - The new place alone, with a word that asks for a change ("Actually Paris", "make it Paris instead", "let's
      go with Paris"): "from Paris" changes the origin, "to Paris" and a place alone the destination.
    Only when a place slot is already collected; a value that is not a place alone is never returned.
    """
    if not any(current.get(slot) for slot in ("origin", "destination")):
        return {}
    for pattern in _OLD_NEW:
        for match in pattern.finditer(text):
            old, new = _place_words(match.group("old")), _place_words(match.group("new"))
            slot = _slot_holding(old, current) if old else None
            if slot and new and new.lower() != str(current.get(slot) or "").lower():
                return {slot: new}
    for slot, pattern in _NAMED_SLOT:
        named = pattern.search(text)
        if named and (new := _place_words(named.group("new"))):
            return {slot: new}
    if not _CHANGE_WORDS.search(text):
        return {}
    # The new place alone, in the whole message or in one of its parts ("Actually Paris, and 3 of us").
    for part in (text, *re.split(r"\s*(?:[,;]|\band\b|\bbut\b|\.\s)\s*", text)):
        alone = _NEW_ALONE.match(_LEAD.sub("", part.strip()))
        if alone is None:
            continue
        rest = alone.group("rest")
        new = _place_words(rest)
        if new is not None and not _slot_holding(new, current):
            return {_direction_of(rest) or "destination": new}
    return {}


# What the old value of a change was, taken out before the new values are read: "the 20th instead of the 15th"
# is the 20th, "3 people, not 2" is 3.
_OLD_CLAUSE = re.compile(
    r"\s*,?\s*(?:instead of|rather than|in place of)\s+[^,.;!?]+|\bnot\s+[^,.;!?]+?\s*,?\s*(?=\bbut\b)|"
    r"\s*,\s*not\s+[^,.;!?]+|\s+not\s+(?:the\s+)?\d[^,.;!?]*$",
    re.IGNORECASE,
)
_CHANGED_PASSENGERS = re.compile(
    rf"\b(?:passengers?|people|travell?ers?|tickets?|seats?|(?:number of|how many) (?:passengers|people|travell?ers|tickets|seats))"
    rf"\s+(?:to|should be|is|will be|=|:)\s+(?P<n>{_NUM})\b",
    re.IGNORECASE,
)
_NUMBER_ALONE = re.compile(rf"^(?P<n>{_NUM})$", re.IGNORECASE)
_NUMBER_AS_CHANGE = re.compile(
    rf"\b(?:make (?:it|that)|change (?:it|that) to|actually|now)\s+(?:just\s+)?(?P<n>{_NUM})\b"
    rf"(?!\s*(?:st\b|nd\b|rd\b|th\b|/|-|:|am\b|pm\b|o'?clock|{_MONTH}|days?|nights?|weeks?))",
    re.IGNORECASE,
)


def _without_old_values(text: str) -> str:
    return _OLD_CLAUSE.sub("", text).replace(" but ", " ")


def _changed_passengers(text: str, current: Mapping[str, Any]) -> int | None:
    """ "change the passengers to 3", or a number alone said as a change ("make it 3", "actually three") once the
    number of passengers is known."""
    match = _CHANGED_PASSENGERS.search(text)
    if match:
        return _number(match.group("n"))
    if current.get("passengers") in (None, "") or not _CHANGE_WORDS.search(text):
        return None
    alone = _NEW_ALONE.match(_LEAD.sub("", text.strip()))
    if alone and (number := _NUMBER_ALONE.match(alone.group("rest").strip())):
        return _number(number.group("n"))
    changed = _NUMBER_AS_CHANGE.search(text)
    return _number(changed.group("n")) if changed else None


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
    current = current or {}
    correction = extract_correction(text, current)
    said = _without_old_values(text) if _CHANGE_WORDS.search(text) else text
    if correction:
        found.update(correction)
    else:
        bare_place = next((s for s in asking if s in ("origin", "destination")), "")
        found.update(extract_places(said, bare=bare_place))
    found.update(extract_dates(said, today=today))
    if "depart_date" not in found and (impossible := impossible_date(said, today=today)):
        found["depart_date"] = impossible
    passengers = extract_passengers(said, bare_answer="passengers" in asking)
    if passengers is None:
        passengers = _changed_passengers(said, current)
    if passengers is not None:
        found["passengers"] = passengers
    flight = extract_flight_number(said)
    if flight is not None:
        found["flight_number"] = flight
    return found
