"""The captions a question is answered from: captioned rows under its camera and time filters, best first.

Hybrid (semantic search on): store/semantic.py's fusion of meaning and words over the search text. Words (off):
each content word of the search text ranked by the full-text index (BM25 / ts_rank) within the same bounded
window, the word lists fused by reciprocal rank, so a caption matching more of the words ranks higher and one
matching any word is found (`q` needs every word, which a question seldom meets). A question whose words are
all question words ("what happened yesterday?") gets the newest captions under its filters.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy import Engine, select

from visioncap.ask.question import Question
from visioncap.store.embeddings import TextEmbedder
from visioncap.store.records import CaptionRecord, CaptionStatus
from visioncap.store.search import (
    _CAPTION_COLUMNS,
    _WORD,
    CaptionFilter,
    CaptionRow,
    SearchLimits,
    _limited,
    _nth,
    search_captions,
)
from visioncap.store.search import _walk_conditions as walk_conditions
from visioncap.store.semantic import _STOP_WORDS, _fused, _window, _word_ranks, semantic_search

# Words that ask rather than describe: searching for them finds captions by accident.
QUESTION_WORDS = frozenset(
    {"what", "who", "whom", "whose", "when", "where", "which", "why", "how", "did", "does", "do", "done", "has"}
    | {"have", "had", "was", "were", "any", "anyone", "anybody", "anything", "see", "saw", "seen", "happen"}
    | {"happened", "happening", "going", "me", "tell", "show", "i", "you", "we", "my", "our", "there", "can"}
    | {"could", "would", "please", "about", "all", "everything", "today", "yesterday", "time", "times", "s", "t"}
)


@dataclass(frozen=True, slots=True)
class Retrieved:
    rows: list[CaptionRow]
    method: str  # "hybrid", "words" or "newest"


def content_words(search_text: str) -> list[str]:
    """The words of the search text that describe a scene."""
    words = [word.lower() for word in _WORD.findall(search_text)]
    return list(dict.fromkeys(w for w in words if w not in _STOP_WORDS and w not in QUESTION_WORDS and len(w) > 1))


def _by_words(engine: Engine, query: CaptionFilter, words: list[str], k: int, limits: SearchLimits) -> list[CaptionRow]:
    with _limited(engine, limits.timeout_s) as conn:
        top = _nth(conn, walk_conditions(query), 0)
        if top is None:
            return []
        window = _window(conn, engine, query, top, limits.scan_rows)
        fused: dict[int, float] = {}
        for word in words:
            # A single word: store/semantic.py reads its last word as a prefix too ("courier" finds "couriers").
            for row_id, score in _fused({}, _word_ranks(conn, window, [word])).items():
                fused[row_id] = fused.get(row_id, 0.0) + score
        ids = [row_id for _, row_id in sorted(((score, row_id) for row_id, score in fused.items()), reverse=True)][:k]
        found = {row.id: row for row in conn.execute(select(*_CAPTION_COLUMNS).where(CaptionRecord.id.in_(ids)))}
    return [found[row_id] for row_id in ids if row_id in found]


def retrieve(
    engine: Engine, embedder: TextEmbedder | None, question: Question, k: int, limits: SearchLimits
) -> Retrieved:
    """Up to `k` captioned rows for `question`, best first."""
    query = CaptionFilter(
        cameras=question.cameras, since=question.since, until=question.until, statuses=[CaptionStatus.CAPTIONED]
    )
    words = content_words(question.search_text)
    if not words:
        rows, _next = search_captions(engine, query, k, limits=limits)
        return Retrieved(rows, "newest")
    if embedder is not None:
        text = " ".join(words)
        rows, _scores, _next = semantic_search(
            engine, embedder, replace(query, text=None), text, k, hybrid=True, limits=limits
        )
        return Retrieved(rows, "hybrid")
    return Retrieved(_by_words(engine, query, words, k, limits), "words")
