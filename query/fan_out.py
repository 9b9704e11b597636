"""Every shard at once: one leg's searches on every shard, merged by score; fused hits fetched from their shards.

A leg is one kind of search (keyword or vector) for one query text, across all shards. BM25 scores compare
across shards because every shard scores with the zone-wide IDFs (:mod:`shardfuse.pipeline.index.lexical.stats`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.index.lexical.stats import combine
from shardfuse.pipeline.index.store import ChunkFilter, ChunkRecord
from shardfuse.query.shard_legs import LegHit, ShardSearcher


@dataclass(frozen=True, slots=True)
class Leg:
    hits: list[tuple[int, LegHit]]  # (shard, hit), best first after merging
    ms: float


# A vector leg whose searches are running: per shard, its future (hits, milliseconds).
PendingLeg = list[tuple[int, Future[tuple[list[LegHit], float]]]]


def elapsed_ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


class ShardFanOut:
    """The shards a query worker searches, and the threads that search them (one per worker process)."""

    def __init__(self, shards: Sequence[ShardSearcher]) -> None:
        self.shards = list(shards)
        # Shard-level work (one vector search or fetch on one shard; never waits on another future) runs on
        # ``_pool``. An expansion's extra keyword legs run on ``_phases``, beside its extra vector legs.
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * len(self.shards)), thread_name_prefix="shard")
        # Sized for several concurrent requests (the query pool runs threads).
        self._phases = ThreadPoolExecutor(max_workers=8, thread_name_prefix="leg")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._phases.shutdown(wait=False, cancel_futures=True)

    def keyword(self, query: str, *, zone: str, where: ChunkFilter, limit: int) -> Leg:
        """Every shard's share of the zone's statistics, summed; then every shard's search with them, merged.

        Runs in one thread, shard after shard: each step is a few hundred microseconds of numpy holding the
        GIL, and spreading them over the shard threads measured no faster (100,000 chunks, 4 shards, 2
        cores), only more hand-offs. ``ms`` covers the whole leg.
        """
        t = time.perf_counter()
        stats = combine(shard.keyword_stats(query, zone=zone) for shard in self.shards)
        merged: list[tuple[int, LegHit]] = []
        for shard in self.shards:
            hits = shard.keyword(query, zone=zone, limit=limit, where=where or None, stats=stats)
            merged.extend((shard.shard, hit) for hit in hits)
        return Leg(hits=_best(merged, limit), ms=elapsed_ms(t))

    def keyword_later(self, query: str, *, zone: str, where: ChunkFilter, limit: int) -> Future[Leg]:
        """:meth:`keyword` on another thread, beside vector legs in flight."""
        return self._phases.submit(lambda: self.keyword(query, zone=zone, where=where, limit=limit))

    def submit_vector(
        self, embedding: npt.NDArray[np.float32], *, zone: str, where: ChunkFilter, limit: int, model: str
    ) -> PendingLeg:
        """Send the vector leg's search to every shard (PostgreSQL works on them while this thread goes on)."""

        def search(shard: ShardSearcher) -> Callable[[], list[LegHit]]:
            return lambda: shard.vector(embedding, zone=zone, limit=limit, where=where or None, model=model)

        return [(shard.shard, self._pool.submit(_timed, search(shard))) for shard in self.shards]

    def hydrate(self, chunk_ids: list[str], located: dict[str, int], *, zone: str) -> dict[str, ChunkRecord]:
        """The chunks of ``chunk_ids`` still in ``zone``, each fetched from its shard (``located``)."""
        by_shard: dict[int, list[str]] = {}
        for chunk_id in chunk_ids:
            by_shard.setdefault(located[chunk_id], []).append(chunk_id)
        searchers = {s.shard: s for s in self.shards}
        futures = [self._pool.submit(searchers[shard].fetch, ids, zone=zone) for shard, ids in by_shard.items()]
        records: dict[str, ChunkRecord] = {}
        for future in futures:
            records.update(future.result())
        return records

    def current_indexes(self) -> list[str | None]:
        """Every shard's published BM25 index (generation and delta), switching to it where it changed: part of
        the result cache's keys, so an answer computed before a delta was published is never served after."""
        return [shard.current_index() for shard in self.shards]

    def generations(self) -> dict[str, int | None]:
        """The BM25 generation each shard answered from."""
        return {str(shard.shard): shard.generation() for shard in self.shards}


def merge(pending: PendingLeg, limit: int) -> Leg:
    """One vector leg across shards: every shard's hits by score, best first, cut to ``limit``."""
    merged: list[tuple[int, LegHit]] = []
    slowest = 0.0
    for shard, future in pending:
        hits, ms = future.result()
        slowest = max(slowest, ms)
        merged.extend((shard, hit) for hit in hits)
    return Leg(hits=_best(merged, limit), ms=slowest)


def located(legs: Sequence[Leg]) -> dict[str, int]:
    """The shard each chunk of the legs came from."""
    shards: dict[str, int] = {}
    for leg in legs:
        for shard, hit in leg.hits:
            shards.setdefault(hit.chunk_id, shard)
    return shards


def _timed(search: Callable[[], list[LegHit]]) -> tuple[list[LegHit], float]:
    t = time.perf_counter()
    hits = search()
    return hits, elapsed_ms(t)


def _best(merged: list[tuple[int, LegHit]], limit: int) -> list[tuple[int, LegHit]]:
    merged.sort(key=lambda item: (-item[1].score, item[1].chunk_id))
    return merged[:limit]
