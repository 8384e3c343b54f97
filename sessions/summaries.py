"""Progressive summaries: the turns that leave the sliding window are folded into a running summary.

``summary_request_if_due`` runs after every turn. It asks for a summary a little before turns
leave the window (``SUMMARY_LEAD_TURNS``), in batches (``SUMMARY_BATCH_TURNS``), so the next
call normally finds it ready; when it is not, the context builder keeps the unsummarized turns
and degrades if they do not fit. The Celery task ``web.tasks.sessions.summarize_session`` calls
``summarize_session_through``, which asks the (cheap) model to merge the new turns into the
summary — keeping decisions, facts, actions and pending items, dropping filler — bounded by the
summary section budget. When the model fails, ``extractive_summary`` keeps the summary bounded
without it.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from core.queue import enqueue
from core.services import requeue_each
from llm.base import CallContext, LLMError
from llm.prompt import ContextBudget, TurnText, cut_to_budget, window_size
from llm.providers import get_provider
from llm.tokens import TokenCounter, counter_for
from sessions.context import TurnHistory, turn_history
from sessions.models import ChatSession, Turn

if TYPE_CHECKING:
    from llm.base import LLMProvider

logger = logging.getLogger(__name__)

# Keep at most this many tokens of one sentence in an extractive summary line.
EXTRACT_LINE_TOKENS = 60
SUMMARIZE_INSTRUCTIONS = """You maintain the running summary of a conversation between a user and an assistant.
Merge the existing summary and the new turns into one updated summary.
Keep: decisions made; facts about the user and the task (names, numbers, dates, places, references, preferences);
actions taken (tool calls, bookings) and their results; pending items and open questions.
Drop: greetings, thanks, small talk, filler and repetition.
Put decisions and facts first. Write short bullet lines ("- ..."). Never invent anything.
Use at most {limit} tokens. Answer with the summary only."""


def _lead_turns() -> int:
    return int(getattr(settings, "SUMMARY_LEAD_TURNS", 2))


def _batch_turns() -> int:
    return int(getattr(settings, "SUMMARY_BATCH_TURNS", 2))


def summary_due(*, turns: Sequence[TurnText], budget: ContextBudget, counter: TokenCounter, through_seq: int) -> int:
    """The seq a summary should now reach, or 0 when none is due.

    ``turns`` are the newest completed turns, oldest first (``window_turns + SUMMARY_LEAD_TURNS + 1``
    of them suffice). The window is ``llm.prompt.window_size``. Due: turns that left the
    window, or will within ``SUMMARY_LEAD_TURNS`` turns, are not in the summary, and either
    ``SUMMARY_BATCH_TURNS`` of them have gathered or some have already left.
    """
    if not turns:
        return 0
    last = turns[-1].seq
    in_window = window_size(turns, budget=budget, counter=counter)
    left = turns[len(turns) - in_window].seq - 1 if in_window else last
    soon = _lead_turns()
    if in_window == len(turns) and in_window < budget.window_turns:
        # Nothing has left yet and the window has room: only the turns that overflow it leave soon.
        soon = max(0, in_window + soon - budget.window_turns)
    due = min(last, left + soon)
    if due <= through_seq or (due - through_seq < _batch_turns() and left <= through_seq):
        return 0
    return due


def checked_turns(budget: ContextBudget) -> int:
    """How many of the newest completed turns the summary trigger looks at."""
    return budget.window_turns + _lead_turns() + 1


def newest_turns(*, session: ChatSession, budget: ContextBudget) -> list[TurnText]:
    """The newest completed turns the window and the summary trigger look at, oldest first."""
    # More than the window (budget.window_turns), so the read stops at exactly this many.
    return turn_history(session=session, cap=checked_turns(budget)).newest


# The summary task (``web.tasks.sessions.summarize_session``), sent by name: tasks are doors, above this.
SUMMARY_TASK = "sessions.tasks.summarize_session"


def summary_request_if_due(
    *, session: ChatSession, history: TurnHistory | None = None, finished: TurnText | None = None
) -> bool:
    """Enqueue a summary of the turns leaving the window, unless they are folded in or already requested.

    See ``summary_due`` for when it is due. Returns whether a task was requested; it is sent
    after the current transaction commits (``web.tasks.sessions.summarize_session``). A caller that read the
    history for the turn that just finished (``history``, then ``finished`` completed) hands both over,
    and the newest turns are not read again.
    """
    budget = ContextBudget.from_agent(session.agent)
    turns = None
    if history is not None and finished is not None:
        turns = history.newest_with(finished, checked_turns(budget))
    due = summary_due(
        turns=turns if turns is not None else newest_turns(session=session, budget=budget),
        budget=budget,
        counter=counter_for(session.agent.model),
        through_seq=session.summary_through_seq,
    )
    requested = session.summary_requested_seq
    if not due or due <= requested:
        # Not due, or this request was made already (as this copy of the session knows it).
        return False
    if requested > session.summary_through_seq and due - requested < _batch_turns():
        # A request is still in flight: one at a time. Each task is a model call, and a worker that lags
        # would otherwise get one per turn. A lost request is superseded once a batch more is due (or
        # sent again by the sweep, ``summaries_requeue``).
        return False
    # Compare-and-set, so two turns finishing together request once; a lost task is superseded by
    # the next request, whose seq is higher.
    updated = ChatSession.objects.filter(pk=session.pk, summary_requested_seq__lt=due).update(summary_requested_seq=due)
    if not updated:
        return False
    session.summary_requested_seq = due
    session_id = str(session.pk)

    transaction.on_commit(lambda: enqueue(SUMMARY_TASK, session_id, due))
    return True


# A summary request is recorded (summary_requested_seq) before its task is sent. If the broker was down,
# the task was lost; a later turn supersedes it, but a session that goes quiet would stay unsummarized.
# The sweep sends requests that are still open after this long again (the task is idempotent).
SUMMARY_LOST_AFTER = timedelta(minutes=5)
SUMMARY_LOOKBACK = timedelta(days=1)
# A request the sweep sent is not sent again before this long (core.services.requeue_claim).
SUMMARY_REQUEUE_AGAIN_AFTER = timedelta(minutes=30)


def summaries_requeue(
    *,
    older_than: timedelta = SUMMARY_LOST_AFTER,
    lookback: timedelta = SUMMARY_LOOKBACK,
    limit: int = 500,
    again_after: timedelta = SUMMARY_REQUEUE_AGAIN_AFTER,
) -> int:
    """Enqueue again the summaries requested but not done after ``older_than`` (the outbox sweep).

    A request sent within ``again_after`` is not sent again (``requeue_claim``: with the workers behind
    it is still queued). Returns how many were sent (at most ``limit``); stops at the first failed
    enqueue (the broker is still down).
    """
    now = timezone.now()
    pending = (
        ChatSession.objects.filter(
            summary_requested_seq__gt=F("summary_through_seq"),
            updated_at__lte=now - older_than,
            updated_at__gte=now - lookback,
        )
        .order_by("updated_at")
        .values_list("pk", "summary_requested_seq")[: limit * 4]
    )
    return requeue_each(
        "summary",
        (
            (f"{session_id}:{through_seq}", partial(enqueue, SUMMARY_TASK, str(session_id), through_seq))
            for session_id, through_seq in pending
        ),
        within=again_after,
        limit=limit,
    )


def summarize_session_through(
    *, session_id: uuid.UUID | str, through_seq: int, provider: LLMProvider | None = None
) -> bool:
    """Fold the completed turns up to ``through_seq`` into the session's summary. Idempotent.

    Uses the agent's cheap model (temperature 0); on an ``LLMError`` (a cut-off reply included) falls
    back to ``extractive_summary``. The summary and ``summary_through_seq`` are stored with a
    conditional update, so they never move backwards. Returns whether the summary was updated.
    No transaction is held during the model call.
    """
    session = ChatSession.objects.select_related("agent").filter(pk=session_id).first()
    if session is None or session.summary_through_seq >= through_seq:
        return False
    turns = list(
        Turn.objects.filter(
            session=session,
            status=Turn.Status.COMPLETED,
            seq__gt=session.summary_through_seq,
            seq__lte=through_seq,
        )
        .order_by("seq")
        .values_list("seq", "user_message", "assistant_message")
    )
    if not turns:
        return False
    texts = [TurnText(seq=s, user=u, assistant=a) for s, u, a in turns]
    new_through = texts[-1].seq
    budget = ContextBudget.from_agent(session.agent)
    limit = budget.section_limit("summary")
    if provider is None:
        try:
            provider = get_provider(agent=session.agent, cheap=True)
        except LLMError as exc:
            # A misconfigured endpoint must not let the history go unsummarized: stay bounded without it.
            logger.error("no summarizer for agent %s (%s); extractive summary", session.agent_id, exc)
            summary = extractive_summary(
                previous=session.summary, turns=texts, limit=limit, counter=counter_for(session.agent.model)
            )
            return _store(session=session, summary=summary, through_seq=new_through)
    counter = counter_for(provider.model or session.agent.model)
    # The user's messages already summarized, newest first: a stated fact that a model's merge drops is added back.
    earlier = Turn.objects.filter(
        session=session, status=Turn.Status.COMPLETED, seq__lte=session.summary_through_seq
    ).order_by("-seq")[:STATED_FACTS_LOOKBACK_TURNS]
    stated = [TurnText(seq=seq, user=user, assistant="") for seq, user in earlier.values_list("seq", "user_message")]
    summary = summarize_turns(
        previous=session.summary,
        turns=texts,
        limit=limit,
        provider=provider,
        counter=counter,
        ctx=CallContext(purpose="summarize", agent_id=session.agent_id, session_id=session.pk),
        prompt_limit=budget.prompt_limit,
        earlier=stated[::-1],
    )
    return _store(session=session, summary=summary, through_seq=new_through)


def _store(*, session: ChatSession, summary: str, through_seq: int) -> bool:
    # Conditional: a slower task for fewer turns never overwrites a newer summary.
    updated = ChatSession.objects.filter(pk=session.pk, summary_through_seq__lt=through_seq).update(
        summary=summary, summary_through_seq=through_seq
    )
    return bool(updated)


def summarize_turns(
    *,
    previous: str,
    turns: Sequence[TurnText],
    limit: int,
    provider: LLMProvider,
    counter: TokenCounter,
    ctx: CallContext,
    prompt_limit: int,
    earlier: Sequence[TurnText] = (),
) -> str:
    """The previous summary merged with ``turns``, at most ``limit`` tokens: by the model, else extractive. A
    model's summary keeps what the user stated in ``turns`` and ``earlier`` (turns already summarized):
    ``with_stated_facts``."""
    instructions = SUMMARIZE_INSTRUCTIONS.format(limit=limit)
    fixed = counter.count(instructions) + counter.count(previous) + 64
    # A batch with a pasted document must still fit the summarizer's own prompt: cut each message evenly.
    per_message = max(64, (prompt_limit - limit - fixed) // max(1, 2 * len(turns)))
    transcript = "\n".join(
        f"Turn {t.seq}:\nUser: {cut_to_budget(t.user, per_message, counter)[0]}\n"
        f"Assistant: {cut_to_budget(t.assistant, per_message, counter)[0]}"
        for t in turns
    )
    messages = [
        {"role": "system", "content": instructions},
        {
            "role": "user",
            # Headers are kept to two words so an extractive summarizer (the demo model) skips them.
            "content": f"Existing summary:\n{previous.strip() or '(none yet)'}\n\nNew turns:\n{transcript}",
        },
    ]
    if counter.count_messages(messages) > prompt_limit:
        logger.warning("summary prompt over budget for turns %s-%s; extractive summary", turns[0].seq, turns[-1].seq)
        return extractive_summary(previous=previous, turns=turns, limit=limit, counter=counter)
    try:
        completion = provider.complete(messages, ctx=ctx, temperature=0, max_tokens=limit)
    except LLMError as exc:
        # TruncatedOutputError is an LLMError too: a cut-off summary is never stored as complete.
        logger.warning("summarizer failed (%s); extractive summary instead", type(exc).__name__)
        return extractive_summary(previous=previous, turns=turns, limit=limit, counter=counter)
    text = completion.text.strip()
    if not text:
        return extractive_summary(previous=previous, turns=turns, limit=limit, counter=counter)
    return with_stated_facts(text, previous=previous, turns=[*earlier, *turns], limit=limit, counter=counter)


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
