"""Both legs of search, checked for every document of a fault run.

PostgreSQL rows say what was written; a user relies on what search finds. After a fault the BM25 index can
miss a committed document (its bookkeeping lost between the shard commit and the BM25 schedule) while its
rows are all there, so every fault test also asks, for EVERY document it published:

- the keyword leg (``mode=keyword``): a search for the document's unique word (a word no other document of
  the zone contains, :func:`unique_word`) returns that document: the PUBLISHED BM25 index (generation plus
  delta) holds it;
- the semantic leg (``mode=semantic``): a search for its first chunk's indexed text (context, then text: what
  was embedded) returns that document among the top ``k``. With the hashing embedder, or the fake provider,
  the query's vector is the chunk's own, and the search runs at pgvector's widest ``ef_search``, so only a
  missing or wrong vector misses.

The searches run through the real query service (:class:`shardfuse.query.search.SearchService`, built by
:class:`shardfuse.workers.runtime.WorkerRuntime` from the stack's settings exactly as a query worker builds
it), in this process, many at once, around the result cache (``cache=False``: a stale cached answer is a
fault of its own, tested elsewhere). 2,000 documents x 2 legs take seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.query.request import Mode, parse_request
from shardfuse.query.search import SearchService
from shardfuse.workers import monitor
from shardfuse.workers.runtime import WorkerRuntime

# Consonants only, without s and y: a word with no vowel has an empty Snowball R1 region, so the English
# stemmer leaves it whole, and the corpus's own words (syllables, each with a vowel) can never equal one.
_MARK_LETTERS = "bcdfghjklmnpqrtvwxz"
SEARCH_THREADS = 8
TOP_K = 10


def unique_word(index: int, *, prefix: str = "qx") -> str:
    """A made-up word for document ``index``: ``qx`` and at least three consonants, distinct per index."""
    digits = ""
    while True:
        index, digit = divmod(index, len(_MARK_LETTERS))
        digits = _MARK_LETTERS[digit] + digits
        if index == 0:
            break
    return prefix + digits.rjust(3, _MARK_LETTERS[0])


@dataclass(frozen=True)
class Expected:
    """A document search must find: its full path in the zone and a word only it contains."""

    path: str
    word: str


@dataclass(frozen=True)
class Miss:
    path: str
    shard: int
    returned: int  # how many results the search returned
    top: tuple[str, ...]  # the first paths it returned

    def __str__(self) -> str:
        top = f": {', '.join(self.top)}" if self.top else ""
        return f"{self.path} (shard {self.shard}; {self.returned} results{top})"


@dataclass
class LegsReport:
    """What :func:`check_both_legs` found for one zone."""

    zone: str
    checked: int = 0
    keyword_misses: list[Miss] = field(default_factory=list)
    semantic_misses: list[Miss] = field(default_factory=list)
    no_chunk: list[str] = field(default_factory=list)  # no chunk row: nothing to search the vector leg with
    absent_found: list[str] = field(default_factory=list)  # words that must find nothing, and did find
    bm25: list[dict[str, Any]] = field(default_factory=list)  # monitor.bm25_freshness when the check ran
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.keyword_misses or self.semantic_misses or self.no_chunk or self.absent_found)

    def summary(self) -> str:
        return (f"both legs of zone {self.zone!r}: {self.checked} documents checked on each leg, "
                f"{len(self.keyword_misses)} keyword miss(es), {len(self.semantic_misses)} semantic miss(es), "
                f"{len(self.no_chunk)} without a chunk, {len(self.absent_found)} absent word(s) found, "
                f"in {self.seconds:.1f} s")

    def details(self, limit: int = 20) -> str:
        lines = [self.summary()]
        for title, misses in (("keyword leg misses", self.keyword_misses),
                              ("semantic leg misses", self.semantic_misses)):
            if misses:
                per_shard = {s: sum(1 for m in misses if m.shard == s) for s in sorted({m.shard for m in misses})}
                lines.append(f"{title} (per shard {per_shard}): " + "; ".join(str(m) for m in misses[:limit]))
        if self.no_chunk:
            lines.append(f"documents with no chunk row: {self.no_chunk[:limit]}")
        if self.absent_found:
            lines.append(f"words that should find nothing found: {self.absent_found[:limit]}")
        lines.append(f"BM25 per shard: {self.bm25}")
        return "\n".join(lines)


def check_both_legs(settings: Settings, zone: str, expected: Collection[Expected], *,
                    absent: Iterable[str] = (), k: int = TOP_K) -> LegsReport:
    """Search ``zone`` for every document of ``expected`` on both legs; ``absent``: words whose keyword search
    must return nothing (an overwritten version's word). Waits first (bounded) for BM25 to be current."""
    started = time.monotonic()
    report = LegsReport(zone, checked=len(expected), bm25=_bm25_current(settings))
    first_chunks = _first_chunk_texts(settings, zone)
    # The vector leg at pgvector's widest ef_search: an HNSW search is approximate (the hashing vectors' recall@10
    # is ~0.85 at the default 160), and a document the graph search passes by has not lost its vector. A fault
    # is what this check looks for; recall is bench_query.py's and bench_vector_recall.py's.
    exact = settings.model_copy(update={"query": settings.query.model_copy(update={"hnsw_ef_search": 1000})})
    runtime = WorkerRuntime(exact)
    try:
        service = runtime.searcher
        with ThreadPoolExecutor(max_workers=SEARCH_THREADS, thread_name_prefix="both-legs") as pool:
            keyword = pool.map(lambda e: _search(service, settings, zone, e.word, Mode.KEYWORD, k), expected)
            semantic = {e.path: pool.submit(_search, service, settings, zone, first_chunks[e.path], Mode.SEMANTIC, k)
                        for e in expected if e.path in first_chunks}
            gone = {word: pool.submit(_search, service, settings, zone, word, Mode.KEYWORD, k) for word in absent}
            for item, paths in zip(expected, keyword, strict=True):
                if item.path not in paths:
                    report.keyword_misses.append(_miss(settings, zone, item.path, paths))
            for item in expected:
                if item.path not in first_chunks:
                    report.no_chunk.append(item.path)
                elif item.path not in (paths := semantic[item.path].result()):
                    report.semantic_misses.append(_miss(settings, zone, item.path, paths))
            report.absent_found = [f"{word} -> {paths[:3]}" for word, future in gone.items()
                                   if (paths := future.result())]
    finally:
        runtime.close()
    report.seconds = time.monotonic() - started
    return report


def assert_found_on_both_legs(settings: Settings, zone: str, expected: Collection[Expected], *,
                              absent: Iterable[str] = ()) -> LegsReport:
    """:func:`check_both_legs`, failing with every miss named (path, shard, what the search returned)."""
    report = check_both_legs(settings, zone, expected, absent=absent)
    print(f"\n{report.summary()}")
    assert report.ok, report.details()
    return report


def _search(service: SearchService, settings: Settings, zone: str, query: str, mode: Mode, k: int) -> list[str]:
    """The paths one search returns, best first (parsed as the search task parses its arguments)."""
    request = parse_request({"query": query, "zone": zone, "mode": mode.value, "k": k, "cache": False},
                            settings=settings.query)
    return [str(result["path"]) for result in service.search(request)["results"]]


def _miss(settings: Settings, zone: str, path: str, returned: list[str]) -> Miss:
    return Miss(path, shard_for(zone, path, settings.shards), len(returned), tuple(returned[:3]))


def _bm25_current(settings: Settings, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Wait until every shard's published BM25 index is current (``shardfuse wait``'s condition; the callers
    drained already, so this is a bound, not a wait); the per-shard state, current or not (a stale shard
    then shows up as keyword misses, with this state in the report)."""
    client = monitor.broker_client(settings)
    try:
        deadline = time.monotonic() + timeout
        while True:
            rows = monitor.bm25_freshness(settings, client)
            if all(row["current"] for row in rows) or time.monotonic() >= deadline:
                return rows
            time.sleep(0.2)
    finally:
        client.close()


def _first_chunk_texts(settings: Settings, zone: str) -> dict[str, str]:
    """Per path of ``zone``: its first chunk's indexed text (``context\\n\\ntext``, or the text alone), as
    :attr:`shardfuse.pipeline.core.documents.Chunk.indexed_text` builds what is embedded."""
    texts: dict[str, str] = {}
    for shard in range(settings.shards):
        query = sql.SQL("SELECT DISTINCT ON (path) path, context, text FROM {}.chunks WHERE zone = %s "
                        "ORDER BY path, ordinal").format(sql.Identifier(f"shard_{shard}"))
        with (psycopg.connect(settings.shard_dsn(shard), connect_timeout=10) as conn,
              contextlib.suppress(psycopg.errors.UndefinedTable)):
            for path, context, text in conn.execute(query, (zone,)).fetchall():
                texts[str(path)] = f"{context}\n\n{text}" if context else str(text)
    return texts
