"""Shard maintenance after writes: a BM25 update (delta, or merge when one is due) and the HNSW build a
bulk load deferred. Each function does one step and says what must follow; the caller schedules it."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.mirror import ShardMirror
from shardfuse.pipeline.index.lexical.tokenizer import Tokenizer
from shardfuse.pipeline.index.lexical.updates import ShardIndexer
from shardfuse.pipeline.index.store.lexical_publication import PostgresLexicalPublication
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

    def build_vector_index(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Bm25Update:
    """A BM25 update's result; ``merge_in_s`` is set when this update claimed the shard's merge, which the
    caller schedules after that many seconds."""

    result: dict[str, Any]
    merge_in_s: float | None = None


def shard_mirror(settings: Settings, store: Any) -> ShardMirror:
    """``store``'s shard's published BM25 index (in the shard's PostgreSQL schema) and this node's local copy
    of it under ``settings.bm25_root``."""
    published = PostgresLexicalPublication(store.pool, store.shard, schema=shard_schema(store.shard))
    return ShardMirror(settings.bm25_root, published, keep_generations=settings.bm25.keep_generations)


def shard_indexer(settings: Settings, shard: int, *, store: Any, freshness: Bm25Freshness,
                  tokenizer: Tokenizer) -> ShardIndexer:
    """The BM25 indexer of ``shard`` as ``settings.bm25`` configures it, publishing to the shard's database."""
    bm25 = settings.bm25
    return ShardIndexer(root=settings.bm25_root, shard=shard, store=store, freshness=freshness, tokenizer=tokenizer,
                        k1=bm25.k1, b=bm25.b, keep_generations=bm25.keep_generations,
                        delta_max_chunks=bm25.delta_max_chunks, merge_after_s=bm25.merge_after_s,
                        publishing=shard_mirror(settings, store))


def update_bm25(indexer: Bm25Indexer, *, claims: MergeClaims, merge: bool, rebuild_debounce_s: float) -> Bm25Update:
    """Bring a shard's BM25 index up to date: a delta of the documents written since its generation
    (``merge=False``), or a full rebuild into a new generation (``merge=True``, which gives the shard's
    merge claim back whatever happens). When a delta reports a merge due, the one caller that claims it
    is told to schedule it, no sooner than the debounce or twice the last build."""
    shard = indexer.shard
    if merge:
        try:
            return Bm25Update(indexer.merge())
        finally:
            claims.release_merge(shard)
    result = indexer.update()
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
