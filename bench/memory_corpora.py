"""The corpora of ``bench.memory_eval``: memory stores of different shapes, each with queries and labels.

A corpus is a set of users' memories (each with a label) and queries (each with the labels of the
memories that answer it). Several shapes, so that no single trick of one shape is what scores:

- ``locomo_turns``: every LoCoMo turn as an episodic memory of its conversation's user, in a chat
  session of its own LoCoMo session (neighbours are real), dated by that session; the questions with
  evidence as queries, the evidence turns as labels.
- ``locomo_observations``: every LoCoMo ``observation`` fact as a semantic memory of its speaker's user,
  dated by its session, labelled with the turns it cites (its ``dia_id``); the questions as queries, asked
  of the user of the speaker who has most of the evidence (the one named in the question on a tie). This
  is the LoCoMo paper's "observations" setting.
- ``locomo_callbacks``: independent memories, conversational queries. The store is a conversation's
  observation facts, written as unrelated rows (shuffled, no session, dated by their session). A query
  is a turn someone says in a later session whose question has evidence in earlier sessions: the turn's
  text as it was said (no question), and as labels the facts of the earlier evidence turns (people
  labelled which turns answer the question: those are the turns the later one calls back to). Facts of the
  query's own session and later are hidden from every ranking (they were not known yet). No LLM is
  involved.
- ``persona``: ``bench/corpora/persona.json``, written for this project by hand: one person's independent
  life events and facts, and turns they might say to an assistant, labelled with the memories a good
  answer needs. Small; it is also the fixture of the retrieval regression test.
- ``life_dialogues``: ``bench/corpora/life_dialogues.json``, written by hand for this project: one person's
  160 independent episodic memories (an event of his life each) and, for each, the one or two sentences in
  which he calls back to it in other words. A query is his side of a conversation so far: an opening,
  everyday asides (three or more, to a length drawn between 80 and 150 tokens), that call-back and a closing, 80 to 170 tokens, composed here with a fixed
  seed. The asides share ordinary words (work, dinner, his partner's name, the car) with memories they
  have nothing to do with: a word match on the whole query finds those. Labelled with the event called
  back to.

- ``people``: ``bench/corpora/people_amara.json`` and ``people_tomasz.json``, written for this project by
  two of its agents (no data copied, no retrieval system consulted): two invented people's 120 independent
  memories each (a teacher in Leeds, a lorry driver near Gdańsk) and 96 short turns each that they might say
  to an assistant, labelled with the memories a good reply needs. About 40 % of the turns share no content
  word with their memories while an unrelated memory shares an incidental word ("night", "again", "last
  time"); about 30 % name a rare word their memory has (a name, a place, a code); the rest overlap
  ordinarily. ``persona``'s shape at a size where a tuning split can see it (its 32 queries leave 8).

The LoCoMo data is read from ``../shared/eval/locomo10.json`` (CC BY-NC 4.0, evaluation only) and never
copied into the repository.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from llm.tokens import counter_for

ROOT = Path(__file__).resolve().parent.parent
LOCOMO = ROOT.parent / "shared" / "eval" / "locomo10.json"
PERSONA = Path(__file__).resolve().parent / "corpora" / "persona.json"
LIFE_DIALOGUES = Path(__file__).resolve().parent / "corpora" / "life_dialogues.json"
# people's kinds of turn: "P" says the need in other words (no content word shared with its memories, an
# incidental one with an unrelated memory), "R" names a rare word its memory has, "O" overlaps ordinarily.
PEOPLE_KINDS = {"P": "paraphrase", "R": "rare word", "O": "ordinary"}
PEOPLE = [Path(__file__).resolve().parent / "corpora" / f"people_{who}.json" for who in ("amara", "tomasz")]
YOUNG_TURNS = 64  # locomo_young: a conversation's first sessions, up to this many turns
DIALOGUE_TOKENS = (80, 170)  # a life_dialogues query's length, cl100k tokens
EVIDENCE_ID = re.compile(r"D:?(\d+):0*(\d+)")


@dataclass(frozen=True)
class MemorySpec:
    label: str
    text: str
    occurred_at: datetime
    kind: str = "episodic"
    session: str | None = None  # memories with the same session key are turns of one chat session


@dataclass(frozen=True)
class QuerySpec:
    user: str
    text: str
    relevant: frozenset[str]
    now: datetime
    hidden: frozenset[str] = frozenset()  # labels left out of every ranking (not known at query time)
    earlier: tuple[str, ...] = ()  # the same person's earlier messages in that conversation, oldest first
    kind: str = ""  # what kind of query it is, where the corpus says (memory_eval reports recall by kind)


@dataclass
class Corpus:
    name: str
    about: str
    memories: dict[str, list[MemorySpec]] = field(default_factory=dict)  # user key -> memories
    queries: list[QuerySpec] = field(default_factory=list)
    turns_written_live: bool = False  # rows written as the turns happened (created_at = occurred_at)


def _dia(raw: str) -> list[str]:
    return [f"D{int(a)}:{int(b)}" for a, b in EVIDENCE_ID.findall(raw)]


def _session_of(label: str) -> int:
    return int(label[1:].split(":")[0])


def parse_session_date(raw: str) -> datetime:
    try:
        return datetime.strptime(raw.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    except ValueError:
        import dateparser

        parsed = dateparser.parse(raw)
        if parsed is None:
            raise
        return parsed.replace(tzinfo=UTC)


def turn_text(turn: dict[str, Any]) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [shares an image: {turn['blip_caption']}]"
    return text


def _load_locomo() -> list[dict[str, Any]]:
    return json.loads(LOCOMO.read_text())


def _sessions(conv: dict[str, Any]) -> list[tuple[int, datetime, list[dict[str, Any]]]]:
    numbers = sorted(
        int(m.group(1)) for key in conv if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(conv[key], list)
    )
    return [(n, parse_session_date(conv[f"session_{n}_date_time"]), conv[f"session_{n}"]) for n in numbers]


def _evidence(qa: dict[str, Any]) -> set[str]:
    return {label for item in qa.get("evidence", []) for label in _dia(item)}


def _observations(sample: dict[str, Any]) -> list[tuple[str, str, list[str], datetime]]:
    """(speaker, fact, cited turns, session date) for every observation of a conversation, in order."""
    dates = {n: when for n, when, _ in _sessions(sample["conversation"])}
    out = []
    for key, by_speaker in sample["observation"].items():
        n = int(re.search(r"\d+", key).group())  # type: ignore[union-attr]
        for speaker, facts in by_speaker.items():
            for fact, cited in facts:
                labels = [lab for item in (cited if isinstance(cited, list) else [cited]) for lab in _dia(item)]
                if labels and n in dates:
                    out.append((speaker, fact, labels, dates[n]))
    return out


def _fact_memories(sample: dict[str, Any], kind: str) -> list[tuple[str, MemorySpec]]:
    """(speaker, memory) for every observation fact: a fact citing several turns is one memory labelled with
    each (its label holds them all, and its place, so equal texts stay apart)."""
    return [
        (speaker, MemorySpec("|".join(labels) + f"#{i}", fact, when, kind=kind))
        for i, (speaker, fact, labels, when) in enumerate(_observations(sample))
    ]


def locomo_turns() -> Corpus:
    corpus = Corpus(
        name="locomo_turns",
        about="LoCoMo turns as episodes of real chat sessions; questions; evidence turns",
        turns_written_live=True,
    )
    for sample in _load_locomo():
        user = sample["sample_id"]
        memories = []
        last = None
        for n, when, turns in _sessions(sample["conversation"]):
            for i, turn in enumerate(turns):
                at = when + timedelta(seconds=20 * i)
                memories.append(MemorySpec(turn["dia_id"], turn_text(turn), at, session=f"{user}/{n}"))
                last = at
        corpus.memories[user] = memories
        assert last is not None
        for qa in sample["qa"]:
            if evidence := _evidence(qa):
                corpus.queries.append(QuerySpec(user, qa["question"], frozenset(evidence), last + timedelta(days=1)))
    return corpus


def locomo_young() -> Corpus:
    """Each LoCoMo conversation when it was young: its first whole sessions up to YOUNG_TURNS turns (a first
    session longer than that is kept whole; none of LoCoMo's is: 16 to 37 turns), and the questions whose
    evidence lies in them, asked the day after. A store this small reads less redundant than
    the grown conversation (bench/store_shape.py), so it gets part of fusion's corrections or none."""
    full = locomo_turns()
    corpus = Corpus(
        name="locomo_young",
        about=f"LoCoMo conversations cut to their first sessions (at most {YOUNG_TURNS} turns); their questions",
        turns_written_live=True,
    )
    for user, memories in full.memories.items():
        kept: list[MemorySpec] = []
        for _, session in itertools.groupby(memories, key=lambda m: m.session):
            turns = list(session)
            if kept and len(kept) + len(turns) > YOUNG_TURNS:
                break
            kept.extend(turns)
        corpus.memories[user] = kept
        labels = {m.label for m in kept}
        now = kept[-1].occurred_at + timedelta(days=1)
        corpus.queries.extend(
            QuerySpec(user, q.text, q.relevant, now) for q in full.queries if q.user == user and q.relevant <= labels
        )
    return corpus


def locomo_observations() -> Corpus:
    corpus = Corpus(
        name="locomo_observations",
        about="LoCoMo observation facts as semantic memories of each speaker; questions; cited turns",
    )
    rng = random.Random(20)
    for sample in _load_locomo():
        conv = sample["conversation"]
        speakers = [conv["speaker_a"], conv["speaker_b"]]
        by_speaker: dict[str, list[MemorySpec]] = {s: [] for s in speakers}
        cited_by: dict[str, set[str]] = {s: set() for s in speakers}
        for speaker, memory in _fact_memories(sample, "semantic"):
            if speaker in by_speaker:
                by_speaker[speaker].append(memory)
                cited_by[speaker] |= label_hits(memory.label)
        for speaker, memories in by_speaker.items():
            rng.shuffle(memories)
            corpus.memories[f"{sample['sample_id']}/{speaker}"] = memories
        last = max(w for _, w, _ in _sessions(conv)) + timedelta(days=1)
        for qa in sample["qa"]:
            evidence = _evidence(qa)
            if not evidence:
                continue

            question = qa["question"].lower()
            speaker = max(speakers, key=lambda sp: (len(evidence & cited_by[sp]), int(sp.lower() in question)))
            if not evidence & cited_by[speaker]:
                continue  # no fact of either speaker cites the evidence
            corpus.queries.append(
                QuerySpec(f"{sample['sample_id']}/{speaker}", qa["question"], frozenset(evidence), last)
            )
    return corpus


def locomo_callbacks() -> Corpus:
    corpus = Corpus(
        name="locomo_callbacks",
        about="independent facts (shuffled, no sessions); a later turn as said; the earlier evidence's facts",
    )
    rng = random.Random(21)
    for sample in _load_locomo():
        user = sample["sample_id"]
        sessions = _sessions(sample["conversation"])
        dates = {n: when for n, when, _ in sessions}
        turns = {t["dia_id"]: (n, t) for n, _, ts in sessions for t in ts}
        session_turns = {n: ts for n, _, ts in sessions}
        memories = [memory for _, memory in _fact_memories(sample, "episodic")]
        rng.shuffle(memories)
        corpus.memories[user] = memories
        cited = {lab for m in memories for lab in label_hits(m.label)}
        by_session: dict[int, set[str]] = {}
        for m in memories:
            for lab in label_hits(m.label):
                by_session.setdefault(_session_of(lab), set()).add(m.label)
        seen: set[tuple[str, frozenset[str]]] = set()
        for qa in sample["qa"]:
            evidence = sorted(_evidence(qa), key=lambda lab: (_session_of(lab), int(lab.split(":")[1])))
            if not evidence or evidence[-1] not in turns:
                continue
            said = evidence[-1]
            n = _session_of(said)
            earlier = frozenset(lab for lab in evidence if _session_of(lab) < n and lab in cited)
            if not earlier or (said, earlier) in seen:
                continue
            seen.add((said, earlier))
            # Asked just before its session: facts of that session and later are not valid yet (valid_from).
            hidden = frozenset(lab for s, labs in by_session.items() if s >= n for lab in labs)
            turn = turns[said][1]
            before = [t for t in session_turns[n] if t["speaker"] == turn["speaker"]]
            before = before[: before.index(turn)][-2:]
            corpus.queries.append(
                QuerySpec(
                    user,
                    turn_text(turn),
                    earlier,
                    dates[n] - timedelta(seconds=1),
                    hidden,
                    tuple(turn_text(t) for t in before),
                )
            )
    return corpus


def _memory_specs(data: dict[str, Any]) -> list[MemorySpec]:
    """The memories of a hand-written corpus file (``persona.json``, ``people_*.json``)."""
    return [
        MemorySpec(m["id"], m["text"], datetime.fromisoformat(m["occurred_at"]), kind=m.get("kind", "episodic"))
        for m in data["memories"]
    ]


def persona() -> Corpus:
    data = json.loads(PERSONA.read_text())
    corpus = Corpus(name="persona", about=data["about"])
    corpus.memories["persona"] = _memory_specs(data)
    now = datetime.fromisoformat(data["now"])
    for q in data["queries"]:
        corpus.queries.append(QuerySpec("persona", q["text"], frozenset(q["relevant"]), now))
    return corpus


def people() -> Corpus:
    """Two people's stores, one user each; the first person's queries, then the second's."""
    files = [json.loads(path.read_text()) for path in PEOPLE]
    corpus = Corpus(name="people", about=" ".join(data["about"] for data in files))
    for path, data in zip(PEOPLE, files, strict=True):
        key = path.stem.removeprefix("people_")
        corpus.memories[key] = _memory_specs(data)
        now = datetime.fromisoformat(data["now"])
        corpus.queries.extend(
            QuerySpec(key, q["text"], frozenset(q["relevant"]), now, kind=PEOPLE_KINDS[q["kind"]])
            for q in data["queries"]
        )
    return corpus


def _dialogue(opening: list[str], asides: list[str], talk: str, closing: list[str], before_last: bool) -> str:
    """One side of a conversation: the opening, the asides with the call-back after them (or before the last
    of them), the closing; an utterance a line."""
    middle = [*asides[:-1], talk, asides[-1]] if before_last else [*asides, talk]
    return "\n".join([*opening, *middle, *closing])


def life_dialogues() -> Corpus:
    data = json.loads(LIFE_DIALOGUES.read_text())
    corpus = Corpus(name="life_dialogues", about=data["about"])
    corpus.memories["life"] = [
        MemorySpec(m["id"], m["text"], datetime.fromisoformat(m["occurred_at"])) for m in data["memories"]
    ]
    now = datetime.fromisoformat(data["now"])
    count = counter_for("").count
    low, high = DIALOGUE_TOKENS
    rng = random.Random(35)
    for m in data["memories"]:
        asides = rng.sample(data["asides"], 12)
        target = rng.randint(low, high - 20)  # lengths spread over the range
        opening = [rng.choice(data["openings"])] if rng.random() < 0.7 else []
        closing = [rng.choice(data["closings"])] if rng.random() < 0.6 else []
        before_talk = rng.random() < 0.4  # the call-back comes before the last aside, not at the end

        n = 3
        while n < len(asides) and count(_dialogue(opening, asides[:n], m["talk"], closing, before_talk)) < target:
            n += 1
        text = _dialogue(opening, asides[:n], m["talk"], closing, before_talk)
        if count(text) < low:
            text = _dialogue(opening, asides[:n], m["talk"], closing or [data["closings"][0]], before_talk)
        assert low <= count(text) <= high, (m["id"], count(text))
        corpus.queries.append(QuerySpec("life", text, frozenset({m["id"]}), now))
    return corpus


BUILDERS = {
    "locomo_turns": locomo_turns,
    "locomo_observations": locomo_observations,
    "locomo_callbacks": locomo_callbacks,
    "locomo_young": locomo_young,
    "persona": persona,
    "life_dialogues": life_dialogues,
    "people": people,
}
NEEDS_LOCOMO = {"locomo_turns", "locomo_observations", "locomo_callbacks", "locomo_young"}


def label_hits(label: str) -> set[str]:
    """The evidence a memory's label stands for ("D1:3|D1:4#17" -> {"D1:3", "D1:4"}; "m12" -> {"m12"})."""
    return set(label.split("#")[0].split("|"))
