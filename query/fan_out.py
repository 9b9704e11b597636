"""Every shard at once: one leg's searches on every shard, merged by score; fused hits fetched from their shards.

A leg is one kind of search (keyword or vector) for one query text, across all shards and every zone the
request names (each zone searched on its own, so each hit knows its zone: :attr:`Leg.zones`). BM25 scores
compare across shards and zones because every search scores with IDFs over all of the named zones' documents
(:mod:`shardfuse.pipeline.index.lexical.stats`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.index.lexical.stats import combine
from shardfuse.pipeline.index.store import ChunkFilter, ChunkRecord
from shardfuse.query.shard_batches import ShardBatch, ShardBatches, single_batches
from shardfuse.query.shard_legs import LegHit, ShardSearcher

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Leg:
    hits: list[tuple[int, LegHit]]  # (shard, hit), best first after merging
    ms: float
    # The zone each hit was found in, by chunk id (a leg built without it: the request's first zone).
    zones: Mapping[str, str] = field(default_factory=dict)
    # Every candidate the leg scores above zero is in ``hits``: its shards found fewer than they were asked
    # for (a rare word's keyword leg). A candidate it missed then scored nothing, which fusion must know.
    complete: bool = False


# A vector leg whose searches are running: per batch of shards and zone, its future (each shard's hits,
# milliseconds).
PendingLeg = list[tuple[str, Future[tuple[dict[int, list[LegHit]], float]]]]


def elapsed_ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


class ShardFanOut:
    """The shards a query worker searches, and the threads that search them (one per worker process)."""

    def __init__(self, shards: Sequence[ShardSearcher], *, batches: ShardBatches | None = None) -> None:
        self.shards = list(shards)
        # How the vector leg's searches and hydration's fetches are sent (query/shard_batches.py): shards of one
        # database in a few statements; by default every shard on its own.
        self._batches = batches or single_batches(self.shards)
        # Shard-level work (one vector search or fetch on one shard; never waits on another future) runs on
        # ``_pool``. An expansion's extra keyword legs run on ``_phases``, beside its extra vector legs.
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * len(self.shards)), thread_name_prefix="shard")
        # Sized for several concurrent requests (the query pool runs threads).
        self._phases = ThreadPoolExecutor(max_workers=8, thread_name_prefix="leg")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._phases.shutdown(wait=False, cancel_futures=True)

    def submit(self, work: Callable[[], T]) -> Future[T]:
        """Other shard-level work on the shard threads (the grep leg's searches, query/grep/)."""
        return self._pool.submit(work)

    def keyword(self, query: str, *, zones: Sequence[str], where: ChunkFilter, limit: int) -> Leg:
        """Every shard's share of the zones' statistics, summed; then every shard's search of each zone with
        them, merged.

        Runs in one thread, shard after shard: each step is a few hundred microseconds of numpy holding the
        GIL, and spreading them over the shard threads measured no faster (100,000 chunks, 4 shards, 2
        cores), only more hand-offs. ``ms`` covers the whole leg.
        """
        t = time.perf_counter()
        stats = combine(shard.keyword_stats(query, zone=zone) for zone in zones for shard in self.shards)
        merged: list[tuple[int, LegHit]] = []
        found_in: dict[str, str] = {}
        for zone in zones:
            for shard in self.shards:
                hits = shard.keyword(query, zone=zone, limit=limit, where=where or None, stats=stats)
                merged.extend((shard.shard, hit) for hit in hits)
                found_in.update((hit.chunk_id, zone) for hit in hits)
        return Leg(hits=_best(merged, limit), ms=elapsed_ms(t), zones=found_in, complete=len(merged) < limit)

    def later(self, work: Callable[[], T]) -> Future[T]:
        """Leg-level work (it may wait on shard-level work) beside the request's thread: the grep leg."""
        return self._phases.submit(work)

    def keyword_later(self, query: str, *, zones: Sequence[str], where: ChunkFilter, limit: int) -> Future[Leg]:
        """:meth:`keyword` on another thread, beside vector legs in flight."""
        return self._phases.submit(lambda: self.keyword(query, zones=zones, where=where, limit=limit))

    def submit_vector(
        self, embedding: npt.NDArray[np.float32], *, zones: Sequence[str], where: ChunkFilter, limit: int, model: str
    ) -> PendingLeg:
        """Send the vector leg's search for each zone to every shard, one statement per batch of shards
        (PostgreSQL works on them while this thread goes on)."""

        def search(batch: ShardBatch, zone: str) -> Callable[[], dict[int, list[LegHit]]]:
            return lambda: batch.vector(embedding, zone=zone, limit=limit, where=where or None, model=model)

        return [(zone, self._pool.submit(_timed, search(batch, zone)))
                for zone in zones for batch in self._batches.vector]

    def hydrate(
        self, chunk_ids: list[str], located: dict[str, int], *, zones: Mapping[str, str]
    ) -> dict[str, ChunkRecord]:
        """The chunks of ``chunk_ids`` still there, each fetched from its shard (``located``) within its own
        zone (``zones``, by chunk id): one fetch per batch of shards (a database's, query/shard_batches.py), and
        a record of any other zone is never kept. The last batch is fetched on this thread, the others beside it."""
        batch_of = {shard: batch for batch in self._batches.fetch for shard in batch.shards}
        asked: dict[int, tuple[ShardBatch, dict[tuple[int, str], list[str]]]] = {}
        for chunk_id in chunk_ids:
            batch = batch_of[located[chunk_id]]
            parts = asked.setdefault(id(batch), (batch, {}))[1]
            parts.setdefault((located[chunk_id], zones[chunk_id]), []).append(chunk_id)
        work = list(asked.values())
        if not work:
            return {}
        futures = [self._pool.submit(batch.fetch, parts) for batch, parts in work[:-1]]
        batch, parts = work[-1]
        records = batch.fetch(parts)
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


def merge(pending: PendingLeg, limit: int, *, min_score: float | None = None) -> Leg:
    """One vector leg across shards and zones: every search's hits (those scoring at least ``min_score``) by
    score, best first, cut to ``limit``."""
    merged: list[tuple[int, LegHit]] = []
    found_in: dict[str, str] = {}
    slowest = 0.0
    for zone, future in pending:
        found, ms = future.result()
        slowest = max(slowest, ms)
        for shard, hits in found.items():
            kept = hits if min_score is None else [hit for hit in hits if hit.score >= min_score]
            merged.extend((shard, hit) for hit in kept)
            found_in.update((hit.chunk_id, zone) for hit in kept)
    return Leg(hits=_best(merged, limit), ms=slowest, zones=found_in)


def located(legs: Sequence[Leg]) -> dict[str, int]:
    """The shard each chunk of the legs came from."""
    shards: dict[str, int] = {}
    for leg in legs:
        for shard, hit in leg.hits:
            shards.setdefault(hit.chunk_id, shard)
    return shards


def located_zones(legs: Sequence[Leg], *, default: str) -> dict[str, str]:
    """The zone each chunk of the legs was found in; ``default`` for a hit of a leg that does not say."""
    zones: dict[str, str] = {}
    for leg in legs:
        for _, hit in leg.hits:
            zones.setdefault(hit.chunk_id, leg.zones.get(hit.chunk_id, default))
    return zones


def _timed(search: Callable[[], dict[int, list[LegHit]]]) -> tuple[dict[int, list[LegHit]], float]:
    t = time.perf_counter()
    hits = search()
    return hits, elapsed_ms(t)


def _best(merged: list[tuple[int, LegHit]], limit: int) -> list[tuple[int, LegHit]]:
    merged.sort(key=lambda item: (-item[1].score, item[1].chunk_id))
    return merged[:limit]
