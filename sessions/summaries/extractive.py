"""What a summary keeps with no model: the extractive summary (the fallback when the model fails), and the
check of a model's summary against what the user stated (``with_stated_facts``). Both score the sentences
the same way (``_score``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from llm.prompt import TurnText
from llm.tokens import TokenCounter

# Keep at most this many tokens of one sentence in an extractive summary line.
EXTRACT_LINE_TOKENS = 60


# --- Extractive fallback ------------------------------------------------------------------------
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
# Facts about the user outlive everything else: they are what a long conversation must not forget.
_PERSONAL = re.compile(
    r"\b(my name|i am|i'm|i live|i work|i prefer|my \w+ (number|is|are)|allerg\w*|always|never)\b", re.IGNORECASE
)
# Someone of the user's, named: "my partner Sam Ortega", "my son Leo", "my manager, Ana" (a fact about the user).
_NAMED_RELATION = re.compile(r"\b[Mm]y [a-z]+,? [A-Z][a-z]+")
_FACT_WORDS = re.compile(
    r"\b(decid\w*|agree\w*|confirm\w*|book\w*|chose|choose|cancel\w*|paid|pay|price|budget|deadline|date|"
    r"address|email|phone|number|reference|account|order|passport|seat|flight|ticket)\b",
    re.IGNORECASE,
)
_PENDING_WORDS = re.compile(
    r"\b(pending|todo|to do|remind|follow up|still need|waiting|open question|next step|later)\b", re.IGNORECASE
)
_FILLER = re.compile(
    r"^(ok|okay|sure|thanks|thank you|great|cool|nice|hi|hello|hey|sounds good|got it|no problem|lol|yes|no)\b[\s!.,]*",
    re.IGNORECASE,
)


def _score(sentence: str) -> float:
    sentence = re.sub(r"^- t\d+ \w+: ", "", sentence)
    score = 0.0
    score += 2 * min(3, len(_PERSONAL.findall(sentence)) + len(_NAMED_RELATION.findall(sentence)))
    if re.search(r"\d", sentence):
        score += 3
    score += min(2, len(_FACT_WORDS.findall(sentence)))
    if _PENDING_WORDS.search(sentence):
        score += 3
    score += 0.5 * min(4, len(re.findall(r"(?<!^)(?<![.!?]\s)\b[A-Z][a-z]+", sentence)))
    if _FILLER.match(sentence) and len(sentence.split()) < 8:
        score -= 4
    return score


def _line_seq(line: str) -> int:
    match = re.match(r"- t(\d+) ", line)
    return int(match.group(1)) if match else 0


def extractive_summary(*, previous: str, turns: Sequence[TurnText], limit: int, counter: TokenCounter) -> str:
    """A bounded summary with no model: the previous lines plus the new turns' informative sentences.

    Sentences are scored (numbers, fact and decision words, pending items, names score up;
    greetings and filler score down). When over ``limit`` tokens, the lowest-scoring lines go
    first, older before newer at equal score. Lines keep their turn number (``- t12 user: …``).
    """
    lines: list[str] = [ln.strip() for ln in previous.splitlines() if ln.strip()]
    seen = {re.sub(r"\W+", " ", ln.split(":", 1)[-1]).strip().lower() for ln in lines}
    for turn in turns:
        for role, text in (("user", turn.user), ("assistant", turn.assistant)):
            for sentence in _SENTENCE.split(text or ""):
                sentence = sentence.strip(" -*\t")
                if len(sentence.split()) < 4 or _score(sentence) <= 0:
                    continue
                key = re.sub(r"\W+", " ", sentence).strip().lower()
                if key in seen:
                    continue
                seen.add(key)
                lines.append(f"- t{turn.seq} {role}: {counter.truncate(sentence, EXTRACT_LINE_TOKENS)}")
    if counter.count("\n".join(lines)) <= limit:
        return "\n".join(lines)
    ranked = sorted(range(len(lines)), key=lambda i: (_score(lines[i]), _line_seq(lines[i]), i), reverse=True)
    kept: set[int] = set()
    used = 0
    for i in ranked:
        cost = counter.count(lines[i]) + 1
        if used + cost <= limit:
            kept.add(i)
            used += cost
    text = "\n".join(lines[i] for i in sorted(kept))
    # Token counts of joined lines can differ by a token or two from the sum of their parts.
    return counter.truncate(text, limit)


# --- What the user stated outlives a model's summary ------------------------------------------------
# A user's sentence states a fact when it scores this much (a number, a name, a personal or decision word).
STATED_FACT_SCORE = 2.0
# How many already-summarized turns are read again for stated facts a model's merge may drop (older ones are
# carried by the summary's own ``- tN user:`` lines).
STATED_FACTS_LOOKBACK_TURNS = 200
# Stated facts a model's summary left out take at most this share of the summary's budget.
STATED_FACTS_SHARE = 0.5
_USER_LINE = re.compile(r"^- t(\d+) user: (.+)$")
_KEY_STOP = frozenset(
    "about after again always because before being could would should their there these those which while "
    "where with from have this that they them then than what when your yours please thanks thank".split()
)


def _key_terms(sentence: str) -> tuple[list[str], list[str]]:
    """What a summary must say for ``sentence`` to count as kept: its numbers, codes and names (exactly), and its
    longer words (as 5-letter stems, so "peanuts" is kept by "peanut allergy")."""
    exact: list[str] = []
    stems: list[str] = []
    for index, raw in enumerate(re.findall(r"\w[\w'-]*", sentence)):
        word = raw.strip("'-")
        if any(ch.isdigit() for ch in word) or (word[:1].isupper() and index > 0 and word != "I"):
            exact.append(word.lower())
        elif len(word) >= 6 and word.lower() not in _KEY_STOP:
            stems.append(word.lower()[:5])
    return exact, stems


def _carries(text: str, term: str) -> bool:
    """Does lower-cased ``text`` carry ``term`` (a number, code or name) as a word of its own: "2" is not carried by
    "2027", nor "Sam" by "same"?"""
    return re.search(rf"(?<![\w-]){re.escape(term)}(?![\w-])", text) is not None


def _kept(sentence: str, summary: str) -> bool:
    """Does ``summary`` carry ``sentence``: every number and name in it, and at least half its longer words?"""
    text = summary.lower()
    exact, stems = _key_terms(sentence)
    if not all(_carries(text, term) for term in exact):
        return False
    return not stems or sum(stem in text for stem in stems) >= 0.5 * len(stems)


def _brings_new(sentence: str, text: str) -> bool:
    """Does ``sentence`` name something (a number, code or name) that lower-cased ``text`` does not carry yet?"""
    return any(not _carries(text, term) for term in _key_terms(sentence)[0])


# Text the user quotes at length (a pasted email, a letter: at least this many characters between quotation
# marks) is someone else's words, not what the user states.
QUOTED_CHARS = 80
_QUOTED = re.compile(
    rf"(?<!\w)'(?=\S).{{{QUOTED_CHARS},}}?(?<=\S)'(?!\w)"
    rf'|"[^"]{{{QUOTED_CHARS},}}"|“[^”]{{{QUOTED_CHARS},}}”|‘[^’]{{{QUOTED_CHARS},}}’|«[^»]{{{QUOTED_CHARS},}}»',
    re.DOTALL,
)


def stated_facts(*, previous: str, turns: Sequence[TurnText]) -> list[tuple[float, int, str]]:
    """The user's own sentences that state a fact, as (score, turn, sentence): those the previous summary kept as
    such (``- t12 user: …`` lines), then those of ``turns``. Questions are not facts, nor what the user quotes
    at length (``QUOTED_CHARS``)."""
    facts: list[tuple[float, int, str]] = []
    seen: set[str] = set()

    def add(seq: int, sentence: str) -> None:
        key = re.sub(r"\W+", " ", sentence).strip().lower()
        if key in seen or sentence.endswith("?") or len(sentence.split()) < 4:
            return
        score = _score(sentence)
        if score >= STATED_FACT_SCORE:
            seen.add(key)
            facts.append((score, seq, sentence))

    for line in previous.splitlines():
        match = _USER_LINE.match(line.strip())
        if match:
            add(int(match.group(1)), match.group(2).strip())
    for turn in turns:
        for sentence in _SENTENCE.split(_QUOTED.sub(" ", turn.user or "")):
            add(turn.seq, sentence.strip(" -*\t"))
    return facts


def with_stated_facts(
    summary: str, *, previous: str, turns: Sequence[TurnText], limit: int, counter: TokenCounter
) -> str:
    """A model's ``summary``, with the user's stated facts it left out added in the user's words, within ``limit``.

    A model, a small one above all, may summarize a conversation into something else: quote it, keep its
    last lines, drop a name or an allergy. What the user said about themselves and the task must survive
    every summary, as it does the extractive one: each sentence of the user that states a fact (a number or
    code, a name, a personal or decision word) and whose numbers, names and half its words the summary does not
    carry is added as a line of its own (``- t3 user: I have a peanut allergy.``), and carried into the next
    summary the same way. They take at most ``STATED_FACTS_SHARE`` of the budget: ``_chosen_facts``; the
    model's summary is shortened to make room."""
    missing = [fact for fact in stated_facts(previous=previous, turns=turns) if not _kept(fact[2], summary)]
    facts = "\n".join(_chosen_facts(missing, summary=summary, room=int(limit * STATED_FACTS_SHARE), counter=counter))
    left = limit - (counter.count(facts) + 1 if facts else 0)
    if counter.count(summary) > left:
        # The model ignored the bound, or the facts need the room: keep its highest-value lines.
        summary = extractive_summary(previous=summary, turns=[], limit=max(0, left), counter=counter)
    return "\n".join(part for part in (summary, facts) if part)


def _chosen_facts(
    facts: Sequence[tuple[float, int, str]], *, summary: str, room: int, counter: TokenCounter
) -> list[str]:
    """The lines of ``facts`` (score, turn, sentence) that go into ``room`` tokens, in turn order.

    Picked one at a time: the highest-scoring first; at equal score, one that names something (a number, code
    or name) that neither ``summary`` nor the lines picked so far carry, then the newest turn. A fact that does
    not fit is passed over for the smaller ones after it. So each companion, place or count the user named is
    kept once before a sentence that names none (a complaint, a story) or repeats one, and the choice is the
    same whether a line comes from the previous summary or from the turns."""
    lines = {
        i: counter.truncate(f"- t{seq} user: {sentence}", EXTRACT_LINE_TOKENS)
        for i, (_, seq, sentence) in enumerate(facts)
    }
    carried = summary.lower()
    left = set(range(len(facts)))
    chosen: list[int] = []
    used = 0
    while left:
        best = max(left, key=lambda i: (facts[i][0], _brings_new(facts[i][2], carried), facts[i][1], -i))
        left.discard(best)
        cost = counter.count(lines[best]) + 1
        if used + cost <= room:
            chosen.append(best)
            used += cost
            carried += "\n" + facts[best][2].lower()
    return [lines[i] for i in sorted(chosen, key=lambda i: (facts[i][1], i))]
