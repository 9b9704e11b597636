"""Shards read together: each batch is one statement for the vector leg's searches, or for hydration's
fetches, of the shards in it (``pipeline/index/store/multi_shard.py``).

A query worker's shards that share a database are batched (:func:`store_batches`): hydration fetches every
such shard's candidates in one statement, and the vector leg splits them over ``statements_per_database``
statements, each on its own thread, since the server searches the shards of one statement one after the
other. Measured at 100,000 chunks in 4 shards of one database on 2 cores (docs/performance.md, issue 23):
2 statements of 2 shards cost less CPU than 4 of 1 at the same latency; 1 of 4 was slower.

A shard that shares its database with no other, or any shard the query side does not know as a PostgreSQL
store (the unit tests' fakes), is a batch of its own: :class:`SingleShard`, its own calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
from psycopg import sql

from shardfuse.pipeline.config.settings import DEFAULT_MODEL
from shardfuse.pipeline.index.store import ChunkFilter, ChunkRecord, ShardStore, embedding_columns, multi_shard
from shardfuse.pipeline.index.store.connections import reading_connection
from shardfuse.pipeline.index.store.schema import shard_schema
from shardfuse.query.shard_legs import LegHit, ShardSearcher

# Which chunks to fetch: by (shard, zone), their ids.
Asked = Mapping[tuple[int, str], Sequence[str]]


class ShardBatch(Protocol):
    """Shards read in one go."""

    @property
    def shards(self) -> tuple[int, ...]: ...

    def vector(self, embedding: npt.NDArray[np.float32], *, zone: str, limit: int, where: ChunkFilter | None,
               model: str) -> dict[int, list[LegHit]]:
        """Each shard's nearest chunks of ``zone`` (as :meth:`ShardSearcher.vector`)."""
        ...

    def fetch(self, asked: Asked) -> dict[str, ChunkRecord]:
        """The asked chunks still there, each only if it is in the zone it was asked in."""
        ...


@dataclass(frozen=True, slots=True)
class ShardBatches:
    """How a query worker reads its shards: the vector leg's batches (each on a thread of its own) and
    hydration's (one per database)."""

    vector: tuple[ShardBatch, ...]
    fetch: tuple[ShardBatch, ...]


class SingleShard:
    """One shard read on its own, through its searcher."""

    def __init__(self, searcher: ShardSearcher) -> None:
        self._searcher = searcher

    @property
    def shards(self) -> tuple[int, ...]:
        return (self._searcher.shard,)

    def vector(self, embedding: npt.NDArray[np.float32], *, zone: str, limit: int, where: ChunkFilter | None,
               model: str) -> dict[int, list[LegHit]]:
        return {self._searcher.shard: self._searcher.vector(embedding, zone=zone, limit=limit, where=where,
                                                            model=model)}

    def fetch(self, asked: Asked) -> dict[str, ChunkRecord]:
        records: dict[str, ChunkRecord] = {}
        for (_, zone), chunk_ids in asked.items():
            fetched = self._searcher.fetch(chunk_ids, zone=zone)
            records.update((chunk_id, r) for chunk_id, r in fetched.items() if r.zone == zone)
        return records


def single_batches(searchers: Sequence[ShardSearcher]) -> ShardBatches:
    """Every shard a batch of its own."""
    batches = tuple(SingleShard(s) for s in searchers)
    return ShardBatches(vector=batches, fetch=batches)


class StoreBatch:
    """Shards of one database (their stores share a pool), read by one statement per call."""

    def __init__(self, stores: Sequence[ShardStore], *, ef_search: int) -> None:
        if not stores or len({id(s.pool) for s in stores}) != 1:
            raise ValueError("a batch holds shards of one database (one pool)")
        self._stores = list(stores)
        self._pool = stores[0].pool
        self._schemas = [sql.Identifier(shard_schema(s.shard)) for s in stores]
        self._ef_search = ef_search
        self._what = "shards " + ", ".join(str(s.shard) for s in stores)

    @property
    def shards(self) -> tuple[int, ...]:
        return tuple(s.shard for s in self._stores)

    def vector(self, embedding: npt.NDArray[np.float32], *, zone: str, limit: int, where: ChunkFilter | None,
               model: str = DEFAULT_MODEL) -> dict[int, list[LegHit]]:
        with reading_connection(self._pool, what=self._what) as conn:
            found = multi_shard.vector_search_shards(
                conn, self._schemas, embedding, zone=zone, limit=limit, ef_search=self._ef_search, where=where,
                column=embedding_columns.column_for(model))
        return {store.shard: [LegHit(h.chunk_id, h.score) for h in hits]
                for store, hits in zip(self._stores, found, strict=True)}

    def fetch(self, asked: Asked) -> dict[str, ChunkRecord]:
        # In shard order, so the statement's text repeats and psycopg prepares it.
        parts = sorted(asked.items())
        if not parts:
            return {}
        schemas = {store.shard: schema for store, schema in zip(self._stores, self._schemas, strict=True)}
        with reading_connection(self._pool, what=self._what) as conn:
            found = multi_shard.fetch_chunks_shards(conn, [(schemas[shard], ids, zone) for (shard, zone), ids in parts])
        records: dict[str, ChunkRecord] = {}
        for ((_, zone), _), fetched in zip(parts, found, strict=True):
            records.update((chunk_id, r) for chunk_id, r in fetched.items() if r.zone == zone)
        return records


def store_batches(stores: Sequence[ShardStore], *, ef_search: int, statements_per_database: int) -> ShardBatches:
    """The stores grouped by database (by pool): one fetch batch per database, and its shards dealt over
    ``statements_per_database`` vector batches (0: one per shard)."""
    databases: dict[int, list[ShardStore]] = {}
    for store in stores:
        databases.setdefault(id(store.pool), []).append(store)
    vector: list[ShardBatch] = []
    fetch: list[ShardBatch] = []
    for group in databases.values():
        fetch.append(StoreBatch(group, ef_search=ef_search))
        statements = len(group) if statements_per_database == 0 else min(len(group), statements_per_database)
        vector.extend(StoreBatch(group[i::statements], ef_search=ef_search) for i in range(statements))
    return ShardBatches(vector=tuple(vector), fetch=tuple(fetch))
