"""The query side's view of one shard: a keyword leg (bm25s), a vector leg (pgvector) and hydration."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.config.settings import DEFAULT_MODEL
from shardfuse.pipeline.index.lexical import LexicalShardReader
from shardfuse.pipeline.index.lexical.stats import TermStats
from shardfuse.pipeline.index.store import ChunkFilter, ChunkRecord, ShardStore
from shardfuse.pipeline.index.store.grep_store import CandidateBlock


class LegHit(NamedTuple):
    chunk_id: str
    score: float


class ShardSearcher(Protocol):
    shard: int

    def keyword_stats(self, query: str, *, zone: str) -> TermStats: ...

    def keyword(
        self, query: str, *, zone: str, limit: int, where: ChunkFilter | None = None, stats: TermStats | None = None
    ) -> list[LegHit]: ...

    def vector(
        self, embedding: npt.NDArray[np.float32], *, zone: str, limit: int, where: ChunkFilter | None = None,
        model: str = DEFAULT_MODEL,
    ) -> list[LegHit]: ...

    def fetch(self, chunk_ids: Sequence[str], *, zone: str) -> dict[str, ChunkRecord]: ...

    def grep_blocks(self, *, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None = None,
                    after: tuple[str, int] | None = None, limit: int) -> list[CandidateBlock]: ...

    def count_grep_blocks(self, *, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None = None,
                          cap: int) -> int: ...

    def generation(self) -> int | None: ...

    def current_index(self) -> str | None: ...


class StoreShardSearcher:
    """A shard served by its PostgreSQL store and its published bm25s index."""

    def __init__(self, *, store: ShardStore, lexical: LexicalShardReader, ef_search: int) -> None:
        self.shard = store.shard
        self._store = store
        self._lexical = lexical
        self._ef_search = ef_search

    def keyword_stats(self, query: str, *, zone: str) -> TermStats:
        return self._lexical.term_stats(query, zone=zone)

    def keyword(
        self, query: str, *, zone: str, limit: int, where: ChunkFilter | None = None, stats: TermStats | None = None
    ) -> list[LegHit]:
        # The index knows chunk ids and zones only: the filter's matching ids come from PostgreSQL and
        # narrow the bm25s weight mask, so the filter applies before the top-k cut.
        allowed = self._store.matching_chunk_ids(zone=zone, where=where) if where else None
        hits = self._lexical.search(query, zone=zone, k=limit, allowed=allowed, stats=stats)
        return [LegHit(h.chunk_id, h.score) for h in hits]

    def vector(
        self, embedding: npt.NDArray[np.float32], *, zone: str, limit: int, where: ChunkFilter | None = None,
        model: str = DEFAULT_MODEL,
    ) -> list[LegHit]:
        hits = self._store.vector_search(embedding, zone=zone, limit=limit, ef_search=self._ef_search, where=where,
                                         model=model)
        return [LegHit(h.chunk_id, h.score) for h in hits]

    def grep_blocks(self, *, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None = None,
                    after: tuple[str, int] | None = None, limit: int) -> list[CandidateBlock]:
        """Candidate blocks of the grep index (query/grep/)."""
        return self._store.grep_blocks(zone=zone, any_of=any_of, where=where, after=after, limit=limit)

    def count_grep_blocks(self, *, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None = None,
                          cap: int) -> int:
        return self._store.count_grep_blocks(zone=zone, any_of=any_of, where=where, cap=cap)

    def fetch(self, chunk_ids: Sequence[str], *, zone: str) -> dict[str, ChunkRecord]:
        return self._store.fetch_chunks(chunk_ids, zone=zone)

    def generation(self) -> int | None:
        return self._lexical.generation

    def current_index(self) -> str | None:
        """The published index's identity (generation and delta: ``ShardManifest.identity``), after switching
        to it if it changed (a cheap stat when it did not); None when nothing is published."""
        manifest = self._lexical.refresh()
        return manifest.identity if manifest is not None else None
