"""Shard maintenance after writes: a BM25 update (delta, or merge when one is due) and the HNSW build a
bulk load deferred. Each function does one step and says what must follow; the caller schedules it."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.manifest import ShardManifest
from shardfuse.pipeline.index.lexical.mirror import ShardMirror
from shardfuse.pipeline.index.lexical.tokenizer import Tokenizer
from shardfuse.pipeline.index.lexical.updates import ShardIndexer
from shardfuse.pipeline.index.store.lexical_publication import PostgresLexicalPublication
from shardfuse.pipeline.index.store.manifest_poll import PublishedManifests
from shardfuse.pipeline.index.store.schema import shard_schema


class Bm25Indexer(Protocol):
    """:class:`~shardfuse.pipeline.index.lexical.updates.ShardIndexer` of one shard."""

    shard: int

    def update(self) -> dict[str, Any]: ...

    def merge(self) -> dict[str, Any]: ...


class MergeClaims(Protocol):
    """The part of :class:`~shardfuse.pipeline.index.lexical.freshness.Bm25Freshness` that paces merges."""

    def claim_merge(self, shard: int) -> bool: ...

    def release_merge(self, shard: int) -> None: ...

    def rebuild_delay(self, shard: int, *, debounce_s: float) -> float: ...


class DeferredIndexStore(Protocol):
    """The part of a shard store that builds a deferred HNSW index."""

    def vector_index_deferred(self) -> bool: ...

    def build_vector_index(self, *, parallel_workers: int | None = None) -> float | None: ...


class ShardIndexStore(DeferredIndexStore, Protocol):
    @property
    def shard(self) -> int: ...


class UpdatePacing(Protocol):
    """The part of :class:`~shardfuse.pipeline.index.lexical.freshness.Bm25Freshness` that spaces delta updates
    during a load."""

    def record_update(self, shard: int, *, seconds: float, at: float) -> None: ...

    def update_wait(self, shard: int, *, factor: float, now: float) -> float: ...


@dataclass(frozen=True, slots=True)
class LoadState:
    """What a BM25 update is told about a load in progress: whether documents wait in the queues, and whether
    the shard's load deferred its indexes (bulk-load mode, :mod:`shardfuse.pipeline.index.store.vector_index`)."""

    loading: Callable[[], bool]
    deferred: Callable[[], bool]


# While documents wait in the queues, a shard's delta update starts no sooner than this many times the last
# one's duration after it ended: a delta is rewritten whole (its cost grows with the documents written since
# the last merge), so back to back during a long load its cost would grow with the square of the load; paced,
# the updates take at most a quarter of one maintenance process. Once the queues are empty, updates run at once.
LOAD_PACE_FACTOR = 3.0


@dataclass(frozen=True, slots=True)
class Bm25Update:
    """A BM25 update's result; ``merge_in_s`` is set when this update claimed the shard's merge (or postponed
    it), which the caller schedules after that many seconds; ``update_in_s`` when this update was paced, and
    the caller sends it again after that many seconds."""

    result: dict[str, Any]
    merge_in_s: float | None = None
    update_in_s: float | None = None


def shard_mirror(settings: Settings, store: Any) -> ShardMirror:
    """``store``'s shard's published BM25 index (in the shard's PostgreSQL schema) and this node's local copy
    of it under ``settings.bm25_root``."""
    published = PostgresLexicalPublication(store.pool, store.shard, schema=shard_schema(store.shard))
    return ShardMirror(settings.bm25_root, published, keep_generations=settings.bm25.keep_generations)


def manifest_readers(stores: Sequence[Any]) -> list[Callable[[], dict[int, ShardManifest | None]]]:
    """A reader of the published BM25 manifests of ``stores``' shards for each database (pool) they share, for
    :class:`~shardfuse.pipeline.index.lexical.follower.IndexFollower`."""
    by_pool: dict[int, list[Any]] = {}
    for store in stores:
        by_pool.setdefault(id(store.pool), []).append(store)
    return [PublishedManifests(group[0].pool, [store.shard for store in group]).read for group in by_pool.values()]


def shard_indexer(settings: Settings, shard: int, *, store: Any, freshness: Bm25Freshness,
                  tokenizer: Tokenizer) -> ShardIndexer:
    """The BM25 indexer of ``shard`` as ``settings.bm25`` configures it, publishing to the shard's database."""
    bm25 = settings.bm25
    return ShardIndexer(root=settings.bm25_root, shard=shard, store=store, freshness=freshness, tokenizer=tokenizer,
                        k1=bm25.k1, b=bm25.b, keep_generations=bm25.keep_generations,
                        delta_max_chunks=bm25.delta_max_chunks, merge_after_s=bm25.merge_after_s,
                        publishing=shard_mirror(settings, store))


def update_bm25(indexer: Bm25Indexer, *, claims: MergeClaims, merge: bool, rebuild_debounce_s: float,
                load: LoadState | None = None, pacing: UpdatePacing | None = None,
                clock: Callable[[], float] = time.time) -> Bm25Update:
    """Bring a shard's BM25 index up to date: a delta of the documents written since its generation
    (``merge=False``), or a full rebuild into a new generation (``merge=True``, which gives the shard's
    merge claim back whatever happens). When a delta reports a merge due, the one caller that claims it
    is told to schedule it, no sooner than the debounce or twice the last build.

    With ``load`` and ``pacing``, a bulk load costs BM25 work in proportion to its size, not its square:
    while documents wait in the queues, deltas are spaced by :data:`LOAD_PACE_FACTOR` times the last one's
    duration (``update_in_s``); while the shard is in bulk-load mode, no merge is claimed during the load and
    a scheduled merge waits for the deferred index builds (a merge re-reads the whole shard, and the load's
    end brings one anyway: the first delta after it claims the merge the growing delta made due). The last
    commit's update always runs: the queues are empty by then.
    """
    shard = indexer.shard
    if merge:
        if load is not None and load.deferred():
            return Bm25Update({"shard": shard, "kind": "merge postponed", "reason": "indexes deferred by a bulk load"},
                              merge_in_s=rebuild_debounce_s)
        try:
            return Bm25Update(indexer.merge())
        finally:
            claims.release_merge(shard)
    loading = load is not None and load.loading()
    if loading and pacing is not None:
        wait = pacing.update_wait(shard, factor=LOAD_PACE_FACTOR, now=clock())
        if wait > 0:
            return Bm25Update({"shard": shard, "kind": "paced", "in_s": round(wait, 3)}, update_in_s=wait)
    started = clock()
    result = indexer.update()
    if pacing is not None and result.get("kind") == "delta":
        ended = clock()
        pacing.record_update(shard, seconds=ended - started, at=ended)
    if loading and load is not None and load.deferred():
        return Bm25Update(result)
    if result.get("merge_due") and claims.claim_merge(shard):
        return Bm25Update(result, merge_in_s=claims.rebuild_delay(shard, debounce_s=rebuild_debounce_s))
    return Bm25Update(result)


class VectorIndexResult(enum.StrEnum):
    WAITING = "waiting"  # documents still wait in the queues: check again later
    PRESENT = "present"  # nothing deferred (another build came first)
    BUILT = "built"
    ELSEWHERE = "building elsewhere"  # another connection is building it


@dataclass(frozen=True, slots=True)
class VectorIndexStep:
    result: VectorIndexResult
    pending_documents: int = 0
    seconds: float | None = None

    def as_dict(self, shard: int) -> dict[str, Any]:
        if self.result is VectorIndexResult.WAITING:
            return {"shard": shard, "result": self.result.value, "pending_documents": self.pending_documents}
        if self.result is VectorIndexResult.PRESENT:
            return {"shard": shard, "result": self.result.value}
        return {"shard": shard, "result": self.result.value, "seconds": self.seconds}


def build_deferred_vector_index(store: DeferredIndexStore, *, pending_documents: Callable[[], int],
                                clear_schedule: Callable[[], object]) -> VectorIndexStep:
    """Build the HNSW index a bulk load deferred, once the load is over (no documents wait in the queues);
    ``WAITING`` until then. The schedule flag is cleared before the build: a write that lands during it
    schedules another, which finds nothing to do."""
    pending = pending_documents()
    if pending:
        return VectorIndexStep(VectorIndexResult.WAITING, pending_documents=pending)
    clear_schedule()
    if not store.vector_index_deferred():
        return VectorIndexStep(VectorIndexResult.PRESENT)
    seconds = store.build_vector_index()
    return VectorIndexStep(VectorIndexResult.BUILT if seconds is not None else VectorIndexResult.ELSEWHERE,
                           seconds=seconds)


def build_deferred_vector_indexes(stores: Sequence[ShardIndexStore], *, pending_documents: Callable[[], int],
                                  clear_schedule: Callable[[int], object], cores: int) -> dict[int, VectorIndexStep]:
    """:func:`build_deferred_vector_index` for every shard of ``stores`` at once: once the load is over, the
    shards whose load deferred their indexes build them side by side, up to ``cores`` at a time (each build
    then gets the parallel maintenance workers the cores leave it). One shard after another, a 2-core
    machine would build at the pace of one build's leader and one worker, and the grep index's GIN build
    (single-process) would leave a core idle. A shard's failed build raises once the others are done."""
    pending = pending_documents()
    if pending:
        return {store.shard: VectorIndexStep(VectorIndexResult.WAITING, pending_documents=pending) for store in stores}
    for store in stores:
        clear_schedule(store.shard)
    deferred = [store for store in stores if store.vector_index_deferred()]
    steps = {store.shard: VectorIndexStep(VectorIndexResult.PRESENT) for store in stores if store not in deferred}
    if not deferred:
        return steps
    threads = max(1, min(len(deferred), cores))
    workers = None if len(deferred) == 1 else max(0, cores // threads - 1)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="index-build") as pool:
        builds = {store.shard: pool.submit(store.build_vector_index, parallel_workers=workers) for store in deferred}
    for shard, build in builds.items():
        seconds = build.result()
        steps[shard] = VectorIndexStep(VectorIndexResult.BUILT if seconds is not None else VectorIndexResult.ELSEWHERE,
                                       seconds=seconds)
    return dict(sorted(steps.items()))
