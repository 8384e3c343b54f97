"""The demo model's summaries: extractive, the sentences that carry facts (numbers, dates, names, decisions, what
the user said of themselves), in order, within the token limit.
"""

from __future__ import annotations

import re

from llm.demo.reading import STOPWORDS, WORD, split_sentences
from llm.demo.registry import DEMO_MODEL_NAME
from llm.tokens import counter_for

_MONTHS_DAYS = re.compile(
    r"\b(jan(uary)?|feb(ruary)?|mar(ch)?|apr(il)?|may|june?|july?|aug(ust)?|sep(t(ember)?)?|oct(ober)?|"
    r"nov(ember)?|dec(ember)?|monday|tuesday|wednesday|thursday|friday|saturday|sunday|today|tomorrow|"
    r"tonight|next week|yesterday)\b",
    re.IGNORECASE,
)
_DECISIONS = re.compile(
    r"\b(decided|decide|agreed|agree|confirm(ed)?|booked|book|chose|choose|chosen|prefer(s|red)?|will|must|"
    r"plan(s|ned)?|want(s|ed)?|need(s|ed)?|selected|cancel(led)?|changed?|set|allergic|always|never|my name|"
    r"live[sd]?)\b",
    re.IGNORECASE,
)
_FILLER = re.compile(
    r"^\W*(hi|hello|hey|thanks|thank you|ok(ay)?|sure|great|cool|got it|sounds good|no problem|you're welcome|"
    r"bye|goodbye|yes|no|alright|fine)\W*$",
    re.IGNORECASE,
)
_SPEAKER = re.compile(r"^(user|assistant|system|tool)\s*:\s*", re.IGNORECASE)
_FIRST_PERSON = re.compile(r"\b(I|I'm|I am|I've|my|me|we|we're|our)\b")
_NORMALISE = re.compile(r"[\d\W_]+")
# The demo's own echoes of tool output and memories: not facts of the conversation.
_ECHO = re.compile(r"^\W*(\[demo model[^\]]*\]\s*)?(the tool answered|related to that, i was told)", re.IGNORECASE)


def _sentence_score(sentence: str, speaker: str = "") -> int:
    body = _SPEAKER.sub("", sentence)
    if _FILLER.match(body) or len(WORD.findall(body)) < 3:
        return 0
    if speaker == "assistant" and (body.rstrip().endswith(("?", "?)")) or _ECHO.match(body)):
        # The assistant's questions are re-asked from the workflow step each turn; they are not facts.
        return 0
    score = 0
    if speaker == "user":
        # What users say ("I'm allergic to peanuts", "my number is QX-4471") is what a summary must keep;
        # the assistant mostly repeats or quotes it.
        score += 3
    if _FIRST_PERSON.search(body):
        score += 2
    if re.search(r"\d", body):
        score += 3
    if _MONTHS_DAYS.search(body):
        score += 2
    if _DECISIONS.search(body):
        score += 2
    # Names: capitalised words that do not start the sentence.
    words = body.split()
    if any(w[:1].isupper() and w.strip(".,!?;:").isalpha() and w.lower() not in STOPWORDS for w in words[1:]):
        score += 1
    return score


def _consider(sentence: str, speaker: str, seen: set[str], candidates: list[tuple[int, int, str]]) -> None:
    # Near-duplicates (the same sentence with other numbers) are kept once.
    key = _NORMALISE.sub(" ", _SPEAKER.sub("", sentence).lower()).strip()
    if key in seen:
        return
    seen.add(key)
    score = _sentence_score(sentence, speaker)
    if score:
        candidates.append((len(candidates), score, sentence))


def extractive_summary(texts: list[str], *, max_tokens: int) -> str:
    """The sentences of ``texts`` that carry facts (numbers, dates, names, decisions), in order, within ``max_tokens``.

    Filler (greetings, thanks, one-word answers) is dropped. When over budget the weakest
    sentences go first; the result never exceeds ``max_tokens`` tokens.
    """
    counter = counter_for(DEMO_MODEL_NAME)
    seen: set[str] = set()
    candidates: list[tuple[int, int, str]] = []  # (position, score, sentence)
    for text in texts:
        speaker = ""
        for line in text.splitlines():
            found = _SPEAKER.match(line.strip())
            if found:
                speaker = found.group(1).lower()
            for sentence in split_sentences(line):
                # A summary carried over puts several speakers on one line: each prefix switches.
                prefixed = _SPEAKER.match(sentence)
                if prefixed:
                    speaker = prefixed.group(1).lower()
                _consider(sentence, speaker, seen, candidates)
    if not candidates:
        return ""
    kept = list(candidates)
    while len(kept) > 1 and counter.count(" ".join(s for _, _, s in kept)) > max_tokens:
        # Drop the weakest; among equals the oldest, since later sentences tend to supersede earlier ones.
        weakest = min(kept, key=lambda item: (item[1], item[0]))
        kept.remove(weakest)
    return counter.truncate(" ".join(s for _, _, s in kept), max_tokens)
