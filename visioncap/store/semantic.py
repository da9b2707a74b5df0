"""Semantic and hybrid search: captions ranked by meaning, or by meaning and words fused.

Over every row the filters keep (cameras, time, people, status; store/vector_index.py): when they keep at most
`scan_rows` rows, all of them are ranked exactly; more, the vector index hands out the nearest candidates by sign
bits, re-ranked exactly with every filter checked again in SQL, their number growing until the page fills. While
the index is being built (the API's start), the rows ranked are a window as before: the newest `scan_rows` rows of
the newest-first walk (one camera, the time range) that meet the other filters. In the rows ranked:

- semantic: by cosine similarity of the caption's vector to the search text's, best first (rows whose vector the
  embedder has not written yet are not ranked);
- hybrid: reciprocal rank fusion (k = 60) of the semantic list and a words list: the window's rows that the
  full-text search of `q` finds for the search text without its stop words (a, the, on, someone, ...), by BM25
  (SQLite FTS5) or ts_rank (PostgreSQL). The words list is the window's also when the index ranks every row by
  meaning (the newest `scan_rows` rows under the filters: every match in the archive is `q`'s). A list of rows
  with any one word was tried: on the labelled set it ranked captions sharing only "man" or "car" with the query
  above the paraphrases (recall@5 0.80 against semantic's 0.95; benchmarks/results/search_quality.md).

Cursor rules: a page ends at a (score, id) and the next page takes the rows ranked below it (score, then id,
descending), in the same window: the cursor carries the window's top row, so rows stored after the first page
do not shift it. A page may repeat or miss a row whose vector was written, or that was deleted, between pages.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    Integer,
    LargeBinary,
    Select,
    any_,
    case,
    column,
    func,
    literal,
    literal_column,
    or_,
    select,
    table,
    text,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY

from visioncap.store.binary_rows import postgres_vectors
from visioncap.store.embeddings import TextEmbedder
from visioncap.store.records import CaptionRecord
from visioncap.store.schema import PG_TS_CONFIG, PG_TSVECTOR_COLUMN, VECTORS_TABLE
from visioncap.store.search import (
    CAPTION_COLUMNS,
    WORD,
    CaptionFilter,
    CaptionRow,
    Position,
    SearchLimits,
    after_position,
    camera_check,
    filter_conditions,
    fts5_query,
    just_above,
    limited,
    newer_than,
    nth,
    row_checks,
    walk_conditions,
)
from visioncap.store.vector_index import IndexFilter, VectorIndex, refreshed

RRF_K = 60
# Candidates the index hands out first, and the factor they grow by while too few pass the filters: 256 sign-bit
# neighbours re-ranked exactly gave recall@10 >= 0.95 against the exact ranking (tests/test_vector_index.py).
MIN_CANDIDATES = 256
CANDIDATE_GROWTH = 4
# At most this share of the candidates is one code (identical sign bits): 16 codes at least among the first 256.
# Copies of one code are as near as each other, so the cap costs a page nothing it would have had unless the page
# holds more than k / 16 of them; then the growth (x4) raises the cap too.
CODE_SHARE = 16
# The words list: the best this many full-text matches of the window (the newest `scan_rows` rows under the
# filters), also over the index, whose meaning ranks the whole archive. Ranking every match costs what the archive
# holds: the newest 4,000 matches of three words took 0.6-0.9 s at 10M rows on PostgreSQL (a bitmap of 94,000
# matches read across the table), where the window's rows are read by the walk's index and then matched (20-30 ms).
# Older captions come by meaning; every match of a word in the whole archive is `q`'s, newest first.
WORDS_LIMIT = 1000
# Words that say nothing about a scene: the words list needs every word, and captions seldom have "someone".
STOP_WORDS = (
    frozenset({"a", "an", "the", "and", "or", "of", "in", "on", "at", "to", "by", "for", "with", "from", "into"})
    | {"onto", "over", "past", "off", "up", "down", "is", "are", "was", "were", "be", "been", "being", "it", "its"}
    | {"this", "that", "these", "those", "there", "here", "some", "someone", "somebody", "something"}
)


@dataclass(frozen=True, slots=True)
class RankedPosition:
    """The semantic cursor: the window's top row, and the (score, id) the last page ended at."""

    top: Position
    score: float
    id: int


def _in_window(
    conn: Connection, engine: Engine, query: CaptionFilter, top: Position, rows: int
) -> list[ColumnElement[bool]]:
    """The terms of the window: the first `rows` rows of the walk at or below `top` that meet the other filters."""
    walk = [*walk_conditions(query), *after_position(just_above(top))]
    cut = nth(conn, walk, rows)
    return [*walk, *row_checks(engine, query), *camera_check(engine, query), *newer_than(cut)]


_VECTORS = table(VECTORS_TABLE, column("caption_id", Integer), column("embedding", LargeBinary))
_FTS = table("captions_fts", column("rowid", Integer))


def _similarities(conn: Connection, window: Select[Any], vector: np.ndarray) -> dict[int, float]:
    in_window = _VECTORS.c.caption_id.in_(window)
    if conn.dialect.name == "sqlite":
        # sqlite-vec computes in SQLite: the vectors never cross into Python.
        distance = func.vec_distance_cosine(_VECTORS.c.embedding, vector.tobytes())
        distances = conn.execute(select(_VECTORS.c.caption_id, distance).where(in_window)).all()
        return {row_id: 1.0 - float(distance) for row_id, distance in distances}
    found: Sequence[Any]
    if conn.dialect.name == "postgresql":
        found = postgres_vectors(conn, list(conn.execute(window).scalars()))
    else:
        found = conn.execute(select(_VECTORS.c.caption_id, _VECTORS.c.embedding).where(in_window)).all()
    if not found:
        return {}
    matrix = np.frombuffer(b"".join(bytes(blob) for _, blob in found), dtype=np.float32).reshape(len(found), -1)
    scores = matrix @ vector
    return {row_id: float(score) for (row_id, _), score in zip(found, scores, strict=True)}


def _sqlite_alike(
    conn: Connection, window: list[ColumnElement[bool]], vector: np.ndarray, floor: float
) -> dict[int, float]:
    """The window's rows at least `floor` alike to `vector` and their similarity, as `_similarities` scores them:
    only those cross into Python."""
    vectors = CaptionRecord.__table__.join(_VECTORS, _VECTORS.c.caption_id == CaptionRecord.id)
    similarity = literal(1.0) - func.vec_distance_cosine(_VECTORS.c.embedding, vector.tobytes())
    statement = select(CaptionRecord.id, similarity).select_from(vectors).where(*window, similarity >= floor)
    return {int(row_id): float(score) for row_id, score in conn.execute(statement)}


def _pg_tsquery(words: list[str]) -> ColumnElement[Any]:
    """Every one of `words`, the last also as a prefix. Only word characters reach to_tsquery (see search.py), so
    its syntax cannot be injected."""
    return func.to_tsquery(literal_column(f"'{PG_TS_CONFIG}'::regconfig"), " & ".join([*words[:-1], f"{words[-1]}:*"]))


def _word_scores(
    conn: Connection, window: list[ColumnElement[bool]], groups: list[list[str]]
) -> list[dict[int, float]]:
    """For each group of words, the full-text score (higher: better; ts_rank, or BM25 negated) of each row of
    `window` (a bounded window: `_in_window`'s terms) with every word of the group: the window's rows found first,
    then matched, however common the words."""
    found: list[dict[int, float]] = [{} for _ in groups]
    if not any(groups):
        return found
    if conn.dialect.name == "sqlite":
        span = _id_range(conn, window)
        if span is None:
            return found
        # FTS5 bounded by the window's id range (its own rowid bound: fast), the window's rows picked by its terms.
        # `+ 0` keeps the join term from reaching FTS5 as a rowid constraint: it would then run the whole match
        # once per window row.
        matches = _FTS.join(CaptionRecord.__table__, CaptionRecord.id == _FTS.c.rowid + 0)
        for place, words in enumerate(groups):
            if not words:
                continue
            match = text("captions_fts MATCH :match").bindparams(match=fts5_query(" ".join(words)))
            statement = select(_FTS.c.rowid, literal_column("bm25(captions_fts)")).select_from(matches)
            statement = statement.where(match, _FTS.c.rowid.between(*span), *window)
            found[place] = {int(row_id): -float(bm25) for row_id, bm25 in conn.execute(statement)}
        return found
    tsvector: ColumnElement[Any] = literal_column(PG_TSVECTOR_COLUMN)
    # Materialized: left to itself the planner ANDs the window's rows with the words index's bitmap (the index
    # scan alone 80 ms for a prefix at 10M rows, and the matches then read across the table) instead of testing
    # the window's few rows. Each group's match is tested once per window row, in it; the WHERE and the ranks
    # read its column.
    queries = [_pg_tsquery(words) if words else None for words in groups]
    flags = [
        (tsvector.op("@@")(query) if query is not None else literal(False)).label(f"m{place}")
        for place, query in enumerate(queries)
    ]
    rows = select(CaptionRecord.id.label("id"), tsvector.label("tsv"), *flags).where(*window)
    scope = rows.cte("words_window").prefix_with("MATERIALIZED")
    matched = [scope.c[f"m{place}"] for place in range(len(groups))]
    # Only a group's matches are ranked: most of the window's rows have none of the words, and ts_rank reads a
    # whole vector.
    ranks = [
        case((flag, func.ts_rank(scope.c.tsv, query)), else_=None) if query is not None else literal(None)
        for flag, query in zip(matched, queries, strict=True)
    ]
    for row_id, *cells in conn.execute(select(scope.c.id, *ranks).where(or_(*matched))):
        for place, rank in enumerate(cells):
            if rank is not None:
                found[place][int(row_id)] = float(rank)
    return found


def _best_first(scores: dict[int, float], limit: int = WORDS_LIMIT) -> list[int]:
    """The ids by score, then the newer first, the first `limit`."""
    return sorted(scores, key=lambda row_id: (scores[row_id], row_id), reverse=True)[:limit]


def _words_list(conn: Connection, window: list[ColumnElement[bool]], words: list[str]) -> list[int]:
    """The words list of `window` (a bounded window's terms): its rows with every one of `words`, best first."""
    return _best_first(_word_scores(conn, window, [words])[0])


def _id_range(conn: Connection, window: list[ColumnElement[bool]]) -> tuple[int, int] | None:
    """The lowest and highest id of the window's rows (None: no rows)."""
    low, high = conn.execute(select(func.min(CaptionRecord.id), func.max(CaptionRecord.id)).where(*window)).one()
    return None if low is None else (int(low), int(high))


def _sqlite_page(
    conn: Connection,
    window: list[ColumnElement[bool]],
    vector: np.ndarray,
    word_ids: list[int] | None,
    after: RankedPosition | None,
    size: int,
    window_rows: int,
) -> list[tuple[float, int]]:
    """The first `size` (score, id) entries below `after`, best first, ranked inside SQLite: the same scores and
    order as `_similarities` and `_fused` give, but the window's rows never cross into Python (10,000 rows of ids,
    distances or vectors cost more there than the ranking itself; benchmarks/results/search_quality-1m.md).
    `word_ids` None: semantic; a list (`_words_list`): hybrid with that words list."""
    vectors = CaptionRecord.__table__.join(_VECTORS, _VECTORS.c.caption_id == CaptionRecord.id)
    similarity = literal(1.0) - func.vec_distance_cosine(_VECTORS.c.embedding, vector.tobytes())
    if word_ids is None:
        scored = select(CaptionRecord.id.label("id"), similarity.label("score")).select_from(vectors).where(*window)
        ranked = scored.subquery()
        statement = select(ranked.c.score, ranked.c.id)
        if after is not None:
            statement = statement.where(tuple_(ranked.c.score, ranked.c.id) < (after.score, after.id))
        statement = statement.order_by(ranked.c.score.desc(), ranked.c.id.desc()).limit(size)
        return [(float(score), int(row_id)) for score, row_id in conn.execute(statement)]
    # Hybrid: a row outside the words list scores 1 / (RRF_K + its semantic rank), falling with the rank, so the
    # page needs only the semantic ranks down to the cursor's place plus a page and the words list's length (each
    # words row may come before any of them), and the words rows' own ranks. SQLite ranks the whole window and
    # returns just those.
    # Clamped to the window: a cursor's score is the client's to send, and ranks past the window do not exist.
    start = 0
    if after is not None and math.isfinite(after.score) and after.score > 0:
        start = min(window_rows, max(0, int(1.0 / after.score) - RRF_K - 1))
    deepest = start + size + len(word_ids) + 2
    rank = func.row_number().over(order_by=(similarity.desc(), CaptionRecord.id.desc()))
    ranks = select(CaptionRecord.id.label("id"), rank.label("rank")).select_from(vectors).where(*window).subquery()
    listed: Select[Any] = select(literal_column("value")).select_from(func.json_each(json.dumps(word_ids)))
    statement = select(ranks.c.id, ranks.c.rank).where(or_(ranks.c.rank <= deepest, ranks.c.id.in_(listed)))
    semantic = {int(row_id): int(position) for row_id, position in conn.execute(statement)}
    return _below(_fused_ranks(semantic, word_ids), after, size)


def _below(scores: dict[int, float], after: RankedPosition | None, size: int) -> list[tuple[float, int]]:
    """The first `size` (score, id) entries after the cursor `after`, best first (ties: the newer row first)."""
    entries = sorted(((score, row_id) for row_id, score in scores.items()), reverse=True)
    if after is not None:
        entries = [entry for entry in entries if entry < (after.score, after.id)]
    return entries[:size]


def _fused(similar: dict[int, float], words: list[int]) -> dict[int, float]:
    """Reciprocal rank fusion of the semantic order and the words order."""
    semantic = sorted(similar, key=lambda row_id: (similar[row_id], row_id), reverse=True)
    return _fused_ranks({row_id: rank for rank, row_id in enumerate(semantic, start=1)}, words)


def _fused_ranks(semantic: dict[int, int], words: list[int]) -> dict[int, float]:
    """Reciprocal rank fusion of semantic ranks (id -> rank, 1 the best; only some ranks, as SQLite returns them)
    and the words order. Summed semantic first, so a score is the same float whichever path ranked it."""
    fused = {row_id: 0.0 + 1.0 / (RRF_K + rank) for row_id, rank in semantic.items()}
    for rank, row_id in enumerate(words, start=1):
        fused[row_id] = fused.get(row_id, 0.0) + 1.0 / (RRF_K + rank)
    return fused


@dataclass(frozen=True, slots=True)
class SemanticPage:
    """A page of a search by meaning, each hit explained: its score (the similarity, or the fused score for
    hybrid), its cosine similarity to the search text, and for hybrid the search words its caption matched."""

    rows: list[CaptionRow]
    scores: list[float]
    similarities: list[float | None]
    matched_words: list[list[str]] | None  # hybrid only
    next: RankedPosition | None
    indexed: bool  # ranked from the vector index (a broad filter) rather than exactly from every row it keeps


def _index_filter(query: CaptionFilter, top: Position) -> IndexFilter:
    return IndexFilter(
        cameras=query.cameras,
        since=query.since,
        until=query.until,
        min_people=query.min_people,
        statuses=query.statuses,
        top=(top.captured_at, top.id),
    )


def _ids_in(conn: Connection, ids: Sequence[int]) -> ColumnElement[bool]:
    """`captions.id` among `ids` (thousands): a JSON array on SQLite, one array parameter on PostgreSQL, not a bound
    parameter each (5,000 of them cost a search on PostgreSQL 40 ms in psycopg's parameter handling alone)."""
    if conn.dialect.name == "sqlite":
        listed: Select[Any] = select(literal_column("value")).select_from(
            func.json_each(json.dumps([int(i) for i in ids]))
        )
        return CaptionRecord.id.in_(listed)
    if conn.dialect.name == "postgresql":
        return CaptionRecord.id == any_(literal([int(i) for i in ids], ARRAY(BigInteger)))
    return CaptionRecord.id.in_([int(i) for i in ids])


def _scope(
    conn: Connection, engine: Engine, query: CaptionFilter, top: Position, limits: SearchLimits, words: bool = False
) -> tuple[list[ColumnElement[bool]], VectorIndex | None]:
    """The terms of the rows to rank, and the index when they are to be ranked from it.

    With the index built: every row the filters keep at or below `top`. When they are at most `scan_rows`, exactly
    (their ids, from the index's columns, and every filter again); more, from the index (returned with it).
    While it is being built: the bounded window of before (the newest `scan_rows` rows of the walk)."""
    index = refreshed(engine)
    if index is None:
        return _in_window(conn, engine, query, top, limits.scan_rows), None
    conditions = [*filter_conditions(engine, query), *after_position(just_above(top))]
    where = _index_filter(query, top)
    if index.count(where) <= limits.scan_rows:
        # With words, rows without a vector yet count too (by their words): the filters alone then, not the ids.
        return (conditions if words else [_ids_in(conn, index.matching(where).tolist()), *conditions]), None
    return conditions, index


def _from_index(
    conn: Connection,
    index: VectorIndex,
    query: CaptionFilter,
    top: Position,
    conditions: list[ColumnElement[bool]],
    vector: np.ndarray,
    enough: Callable[[list[tuple[float, int]]], bool],
    depth: int = 0,
) -> list[tuple[float, int]]:
    """(similarity, id) of the index's nearest candidates that pass every filter, re-ranked exactly, best first;
    the candidates grow (x4) until `enough` says the list is deep enough or the index has no more rows. `depth`:
    how deep the caller knows it needs the list: the first pass asks for that many at once (each pass reads every
    row the filters keep; growing from MIN_CANDIDATES would take two or three)."""
    where = _index_filter(query, top)
    k = max(MIN_CANDIDATES, depth + depth // 8)
    while True:
        ids, every = index.nearest(vector, where, k, per_code=max(1, k // CODE_SHARE))
        candidates = select(CaptionRecord.id).where(_ids_in(conn, ids.tolist()), *conditions)
        ranked = sorted(
            ((score, row_id) for row_id, score in _similarities(conn, candidates, vector).items()), reverse=True
        )
        if every or enough(ranked):
            return ranked
        k *= CANDIDATE_GROWTH


def _matched_words(conn: Connection, ids: list[int], words: list[str]) -> dict[int, list[str]]:
    """Which of `words` (the last also as a prefix, as the words list takes it) each of the rows `ids` matched,
    by the same full-text index."""
    matched: dict[int, list[str]] = {row_id: [] for row_id in ids}
    if not ids:
        return matched
    for place, word in enumerate(words):
        prefix = place == len(words) - 1
        if conn.dialect.name == "sqlite":
            match = f'"{word}"' + ("*" if prefix else "")
            statement = select(_FTS.c.rowid).where(
                text("captions_fts MATCH :match").bindparams(match=match), _FTS.c.rowid.in_(ids)
            )
        else:
            tsquery = func.to_tsquery(literal_column(f"'{PG_TS_CONFIG}'::regconfig"), word + (":*" if prefix else ""))
            statement = select(CaptionRecord.id).where(
                CaptionRecord.id.in_(ids), literal_column(PG_TSVECTOR_COLUMN).op("@@")(tsquery)
            )
        for row_id in conn.scalars(statement):
            matched[int(row_id)].append(word)
    return matched


def explained_search(
    engine: Engine,
    embedder: TextEmbedder,
    query: CaptionFilter,
    search_text: str,
    limit: int,
    *,
    hybrid: bool = False,
    after: RankedPosition | None = None,
    limits: SearchLimits | None = None,
) -> SemanticPage:
    """Up to `limit` rows ranked by meaning (or fused with words) over every row the filters keep, explained,
    and the next page's cursor (None on the last page). `query.text` must be None: the search text is
    `search_text`."""
    query = replace(query, text=None)
    words = [word for word in WORD.findall(search_text) if word.lower() not in STOP_WORDS]
    limits = limits or SearchLimits()
    size = limit + 1
    # The search text is encoded in a thread of its own (~25 ms of PyTorch on a CPU, which lets go of the GIL)
    # while the database finds the rows to rank and, for hybrid, the words list: neither needs the vector. The
    # model is loaded first, here: its seconds, once, are not to count against the search's time limit.
    embedder.load()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="search-text") as encoding:
        encoded = encoding.submit(embedder.encode, [search_text])
        with limited(engine, limits.timeout_s) as conn:
            top = after.top if after is not None else nth(conn, walk_conditions(query), 0)
            if top is None:
                encoded.cancel()
                return SemanticPage([], [], [], [] if hybrid else None, None, False)
            in_scope, index = _scope(conn, engine, query, top, limits, words=hybrid)
            sqlite = conn.dialect.name == "sqlite"
            if index is not None:
                listed = None
                if hybrid:
                    listed = _words_list(conn, _in_window(conn, engine, query, top, limits.scan_rows), words)
                vector = encoded.result()[0]
                if listed is None:
                    below = after

                    def enough(ranked: list[tuple[float, int]]) -> bool:
                        return sum(1 for entry in ranked if below is None or entry < (below.score, below.id)) >= size

                    ranked = _from_index(conn, index, query, top, in_scope, vector, enough)
                    page = _below({row_id: score for score, row_id in ranked}, after, size)
                else:
                    deepest = _start(after, limits.scan_rows * 100) + size + len(listed) + 2
                    ranked = _from_index(
                        conn, index, query, top, in_scope, vector, lambda found: len(found) >= deepest, deepest
                    )
                    semantic = {row_id: rank for rank, (_, row_id) in enumerate(ranked, start=1)}
                    page = _below(_fused_ranks(semantic, listed), after, size)
            elif sqlite:
                listed = _words_list(conn, in_scope, words) if hybrid else None
                vector = encoded.result()[0]
                page = _sqlite_page(conn, in_scope, vector, listed, after, size, limits.scan_rows)
            else:
                window = select(CaptionRecord.id).where(*in_scope)
                listed = _words_list(conn, in_scope, words) if hybrid else None
                vector = encoded.result()[0]
                scores = _similarities(conn, window, vector)
                if listed is not None:
                    scores = _fused(scores, listed)
                page = _below(scores, after, size)
            ids = [row_id for _, row_id in page[:limit]]
            found = {row.id: row for row in conn.execute(select(*CAPTION_COLUMNS).where(CaptionRecord.id.in_(ids)))}
            similar = _similarities(conn, select(CaptionRecord.id).where(CaptionRecord.id.in_(ids)), vector)
            matched = _matched_words(conn, ids, words) if hybrid else None
    kept = [(score, row_id) for score, row_id in page[:limit] if row_id in found]
    following = None
    if len(page) > limit:
        last_score, last_id = page[limit - 1]
        following = RankedPosition(top, last_score, last_id)
    return SemanticPage(
        rows=[found[row_id] for _, row_id in kept],
        scores=[score for score, _ in kept],
        similarities=[similar.get(row_id) for _, row_id in kept],
        matched_words=[matched[row_id] for _, row_id in kept] if matched is not None else None,
        next=following,
        indexed=index is not None,
    )


def _start(after: RankedPosition | None, deepest: int) -> int:
    """The semantic rank a hybrid cursor's score implies (the fused score of a row outside the words list is
    1 / (RRF_K + rank)), clamped: a cursor's score is the client's to send."""
    if after is None or not math.isfinite(after.score) or after.score <= 0:
        return 0
    return min(deepest, max(0, int(1.0 / after.score) - RRF_K - 1))


def semantic_search(
    engine: Engine,
    embedder: TextEmbedder,
    query: CaptionFilter,
    search_text: str,
    limit: int,
    *,
    hybrid: bool = False,
    after: RankedPosition | None = None,
    limits: SearchLimits | None = None,
) -> tuple[list[CaptionRow], list[float], RankedPosition | None]:
    """`explained_search`'s rows, their scores and the next page's cursor."""
    page = explained_search(engine, embedder, query, search_text, limit, hybrid=hybrid, after=after, limits=limits)
    return page.rows, page.scores, page.next


@dataclass(frozen=True, slots=True)
class Meaning:
    """Ranking by meaning beside words, for `any_word_search`: only rows at least `min_similarity` alike count."""

    embedder: TextEmbedder
    min_similarity: float


def any_word_search(
    engine: Engine,
    query: CaptionFilter,
    words: list[str],
    limit: int,
    limits: SearchLimits | None = None,
    *,
    meaning: Meaning | None = None,
) -> list[CaptionRow]:
    """Up to `limit` rows of the window (as `semantic_search`'s) with any of `words`, the rows with more of them
    first: one full-text ranking per word, fused by reciprocal rank. For questions (visioncap/ask/), whose words
    a caption seldom has all of, as `q` and hybrid's words list need. With `meaning`, the window's rows similar
    enough to the words are one more ranking in the fusion, so a paraphrase is found too, and nothing that is
    neither is."""
    query = replace(query, text=None)
    limits = limits or SearchLimits()
    # Encoded before the transaction: the model's milliseconds are not spent holding a snapshot.
    vector = meaning.embedder.encode([" ".join(words)])[0] if meaning is not None else None
    with limited(engine, limits.timeout_s) as conn:
        top = nth(conn, walk_conditions(query), 0)
        if top is None:
            return []
        in_scope, index = _scope(conn, engine, query, top, limits, words=True)
        alike: dict[int, float] | None = None
        if meaning is not None and vector is not None:
            floor = meaning.min_similarity
            if index is not None:

                def enough(ranked: list[tuple[float, int]]) -> bool:
                    return len(ranked) >= WORDS_LIMIT or (bool(ranked) and ranked[-1][0] < floor)

                ranked = _from_index(conn, index, query, top, in_scope, vector, enough)
                alike = {row_id: score for score, row_id in ranked if score >= floor}
            elif conn.dialect.name == "sqlite":
                alike = _sqlite_alike(conn, in_scope, vector, floor)
            else:
                similar = _similarities(conn, select(CaptionRecord.id).where(*in_scope), vector)
                alike = {row_id: score for row_id, score in similar.items() if score >= floor}
        # Each word's list is its matches in the window, as hybrid search's words list. Over the index (a broad
        # filter: a month of many cameras) the window is the newest `scan_rows` rows; the meaning's ranking covers
        # the whole scope.
        words_window = in_scope if index is None else _in_window(conn, engine, query, top, limits.scan_rows)
        scored = _word_scores(conn, words_window, [[word] for word in words])
        rankings = [_fused({}, _best_first(found)) for found in scored]
        if alike is not None:
            rankings.append(_fused(alike, []))
        scores: dict[int, float] = {}
        for ranking in rankings:
            for row_id, score in ranking.items():
                scores[row_id] = scores.get(row_id, 0.0) + score
        ranked = sorted(((score, row_id) for row_id, score in scores.items()), reverse=True)
        best = [row_id for _, row_id in ranked[:limit]]
        found = {row.id: row for row in conn.execute(select(*CAPTION_COLUMNS).where(CaptionRecord.id.in_(best)))}
    return [found[row_id] for row_id in best if row_id in found]
