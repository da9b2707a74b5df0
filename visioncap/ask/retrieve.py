"""The captions a question is answered from: captioned rows under its camera and time filters, best first.

Words (semantic search off): `any_word_search`, each content word ranked by the full-text index (BM25 /
ts_rank) in a bounded window and the lists fused, so a caption with any of the words is found and one with more
of them ranks higher (`q` needs every word, which a question seldom meets). Hybrid (on): the same, fused with the
window's captions ranked by meaning, of which only those at least `min_similarity` alike count: ranked without a
floor, every caption under the filters would come back, and a question about nothing stored ("any giraffes?")
would cite whatever is newest. A question whose words are all question words ("what happened yesterday?") gets
the newest captions under its filters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Engine

from visioncap.ask.question import Question
from visioncap.store.records import CaptionStatus
from visioncap.store.search import WORD, CaptionFilter, CaptionRow, SearchLimits, search_captions
from visioncap.store.semantic import STOP_WORDS, Meaning, any_word_search

# Words that ask rather than describe: searching for them finds captions by accident.
QUESTION_WORDS = frozenset(
    {"what", "who", "whom", "whose", "when", "where", "which", "why", "how", "did", "does", "do", "done", "has"}
    | {"have", "had", "was", "were", "any", "anyone", "anybody", "anything", "see", "saw", "seen", "happen"}
    | {"happened", "happening", "going", "me", "tell", "show", "i", "you", "we", "my", "our", "there", "can"}
    | {"could", "would", "please", "about", "all", "everything", "today", "yesterday", "time", "times"}
)

Method = Literal["hybrid", "words", "newest"]


@dataclass(frozen=True, slots=True)
class Retrieved:
    rows: list[CaptionRow]
    method: Method


def content_words(search_text: str) -> list[str]:
    """The words of the search text that describe a scene (one-letter words say nothing)."""
    words = [word.lower() for word in WORD.findall(search_text)]
    return list(dict.fromkeys(w for w in words if w not in STOP_WORDS and w not in QUESTION_WORDS and len(w) > 1))


def retrieve(
    engine: Engine,
    question: Question,
    k: int,
    limits: SearchLimits,
    meaning: Meaning | None = None,
    cameras: Sequence[str] | None = None,
) -> Retrieved:
    """Up to `k` captioned rows for `question`, best first; hybrid with `meaning` (semantic search on). `cameras`
    (a limited API key's, narrowed to those the question names) replaces the question's cameras; empty: every
    camera."""
    query = CaptionFilter(
        cameras=question.cameras if cameras is None else cameras,
        since=question.since,
        until=question.until,
        statuses=[CaptionStatus.CAPTIONED],
    )
    words = content_words(question.search_text)
    if not words:
        rows, _next = search_captions(engine, query, k, limits=limits)
        return Retrieved(rows, "newest")
    if meaning is not None:
        return Retrieved(any_word_search(engine, query, words, k, limits, meaning=meaning), "hybrid")
    return Retrieved(any_word_search(engine, query, words, k, limits), "words")
