"""Grep across every shard: candidate blocks from each shard's trigram index
(:mod:`shardfuse.pipeline.index.store.grep_store`), their lines verified here, merged in ``(path, line)`` order.

Two uses: the ``grep`` mode's answer (matching lines with their line numbers, at most ``k``, and whether
there were more), and the grep leg of hybrid search (chunks holding a code-like query's tokens verbatim).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

from shardfuse.pipeline.config.grep import GrepSettings
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.index.store import ChunkFilter
from shardfuse.pipeline.index.store.grep_blocks import line_chunk_id, zone_gram
from shardfuse.pipeline.index.store.grep_store import CandidateBlock
from shardfuse.query.grep.pattern import GrepPattern

T = TypeVar("T")
MAX_PAGE_BLOCKS = 1024


class GrepShard(Protocol):
    shard: int

    def grep_blocks(self, *, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None = None,
                    after: tuple[str, int] | None = None, limit: int) -> list[CandidateBlock]: ...

    def count_grep_blocks(self, *, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None = None,
                          cap: int) -> int: ...


class Submit(Protocol):
    """Runs shard-level work on the query worker's shard threads (:meth:`ShardFanOut.submit`)."""

    def __call__(self, work: Callable[[], T]) -> Future[T]: ...


@dataclass(frozen=True, slots=True)
class GrepHit:
    """One matching line: ``line`` is 1-based, ``column`` the 0-based character offset of its first match;
    ``chunk_id`` the chunk holding the line (None when no chunk does: a line the entropy filter dropped)."""

    zone: str
    path: str
    line: int
    column: int
    text: str
    chunk_id: str | None
    shard: int


@dataclass(frozen=True, slots=True)
class GrepFound:
    """Matching lines in ``(path, line)`` order; ``truncated``: there are more (past the line limit, or past
    ``max_blocks`` candidate blocks on some shard); ``blocks``: candidate blocks verified."""

    hits: list[GrepHit]
    truncated: bool
    blocks: int


def index_clauses(pattern: GrepPattern, *, zone: str, where: ChunkFilter | None) -> list[list[int]]:
    """The GIN lookups of ``pattern`` in ``zone`` (OR of ANDs of grams, each with the zone's pseudo-gram).

    A pattern with no certain gram would read every block of the zone: refused, unless a path prefix or
    metadata filter narrows it (then its blocks are read, at most ``max_blocks`` per shard)."""
    gram = zone_gram(zone)
    if pattern.indexed:
        return [[gram, *sorted(clause)] for clause in pattern.clauses]
    if where:
        return [[gram]]
    raise InvalidQueryError(
        f"the {pattern.describe()} has no three characters in a row that every matching line must hold, so the "
        "grep index cannot narrow the search: give it a longer literal part, or narrow it with path_prefix or "
        "filters")


def grep_shard(shard: GrepShard, pattern: GrepPattern, *, zone: str, any_of: list[list[int]],
               where: ChunkFilter | None, max_lines: int, settings: GrepSettings,
               count_first: bool = False) -> GrepFound:
    """``shard``'s first ``max_lines`` matching lines in ``(path, line)`` order, read page by page.

    ``count_first``, for a caller that discards a truncated answer (the hybrid grep leg): count the candidate
    blocks first (:meth:`GrepShard.count_grep_blocks`: the GIN index and the rows' visibility, no text, no sort)
    and give up at once when there are more than ``max_blocks``, instead of sorting them all for a first page
    and reading ``max_blocks`` of them to find out. The answer is the same; a common token such as "IgA" costs
    a ~2 ms count instead of ~8 ms a shard for a first page alone (100,000 chunks, issue 23's tail)."""
    hits: list[GrepHit] = []
    after: tuple[str, int] | None = None
    blocks, page = 0, settings.page_blocks
    if count_first and shard.count_grep_blocks(zone=zone, any_of=any_of, where=where or None,
                                               cap=settings.max_blocks + 1) > settings.max_blocks:
        return GrepFound(hits, truncated=True, blocks=0)
    while True:
        limit = min(page, settings.max_blocks - blocks)
        rows = shard.grep_blocks(zone=zone, any_of=any_of, where=where or None, after=after, limit=limit)
        for row in rows:
            blocks += 1
            hits.extend(_verified(row, pattern, zone=zone, shard=shard.shard, line_chars=settings.line_chars))
            if len(hits) > max_lines:
                return GrepFound(hits[:max_lines], truncated=True, blocks=blocks)
        if len(rows) < limit:
            return GrepFound(hits, truncated=False, blocks=blocks)
        if blocks >= settings.max_blocks:
            return GrepFound(hits, truncated=True, blocks=blocks)
        after = (rows[-1].path, rows[-1].block)
        page = min(page * 4, MAX_PAGE_BLOCKS)


def grep_all(shards: Sequence[GrepShard], submit: Submit, pattern: GrepPattern, *, zones: Sequence[str],
             where: ChunkFilter | None, max_lines: int, settings: GrepSettings) -> GrepFound:
    """Every shard and zone at once (each on a shard thread), merged: the first ``max_lines`` lines of the zones
    in ``(path, line)`` order (a path in two zones: the first zone named first)."""
    return grep_each(shards, submit, [pattern], zones=zones, where=where, max_lines=max_lines, settings=settings)[0]


def grep_each(shards: Sequence[GrepShard], submit: Submit, patterns: Sequence[GrepPattern], *,
              zones: Sequence[str], where: ChunkFilter | None, max_lines: int, settings: GrepSettings,
              count_first: bool = False) -> list[GrepFound]:
    """:func:`grep_all` of several patterns, each pattern's answer in turn; every shard search of every pattern
    is submitted before any is awaited, so they overlap. ``count_first``: as :func:`grep_shard` says."""
    order = {zone: i for i, zone in enumerate(zones)}
    pending = []
    for pattern in patterns:
        lookups = {zone: index_clauses(pattern, zone=zone, where=where) for zone in zones}
        pending.append([submit(partial(grep_shard, shard, pattern, zone=zone, any_of=any_of, where=where,
                                       max_lines=max_lines, settings=settings, count_first=count_first))
                        for zone, any_of in lookups.items() for shard in shards])
    return [_merged([future.result() for future in futures], order, max_lines) for futures in pending]


def _merged(found: Sequence[GrepFound], order: dict[str, int], max_lines: int) -> GrepFound:
    hits = sorted((hit for f in found for hit in f.hits), key=lambda h: (h.path, h.line, order[h.zone]))
    return GrepFound(hits[:max_lines], truncated=len(hits) > max_lines or any(f.truncated for f in found),
                     blocks=sum(f.blocks for f in found))


def _verified(row: CandidateBlock, pattern: GrepPattern, *, zone: str, shard: int,
              line_chars: int) -> list[GrepHit]:
    hits = []
    for match in pattern.matching_lines(row.text):
        line = row.start_line + match.offset
        hits.append(GrepHit(
            zone=zone, path=row.path, line=line, column=match.column, text=clip(match.text, match.column, line_chars),
            chunk_id=line_chunk_id(zone=zone, path=row.path, seq=row.seq, spans=row.chunk_lines, line=line),
            shard=shard))
    return hits


def clip(line: str, column: int, max_chars: int) -> str:
    """``line``, or ``max_chars`` of it around ``column`` with an ellipsis on each cut side."""
    line = line.removesuffix("\r")
    if len(line) <= max_chars:
        return line
    start = max(0, min(column - max_chars // 4, len(line) - max_chars + 1))
    head = "…" if start > 0 else ""
    body = line[start : start + max_chars - len(head) - 1]
    return head + body + "…"


def elapsed_ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
