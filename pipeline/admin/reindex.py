"""Reindexing a zone to a new embedding model side by side, then switching its queries over at once.

1. **start**: the zone's row in ``shardfuse.zone_models`` gets the model as its *target*, and every shard adds
   the model to the zone's fill list (``pipeline/index/store/embedding_columns.py``): the model's column is added
   if missing, and from that commit on every write of the zone carries vectors of both models.
2. **backfill**: the zone's chunks written before that, shard by shard in chunk-id order, are embedded with
   the new model (through its embedding stage: cache, packed requests, retries) and their column filled.
   Queries meanwhile use the old model, undisturbed; ``shardfuse search --model NAME`` tries the new one.
3. **index**: each shard builds an HNSW index over the new column (``CREATE INDEX CONCURRENTLY``).
4. **switch**: once every shard holds a vector of the new model for every chunk of the zone, one ``UPDATE``
   of the zone's row makes it the zone's model: each query reads the row once and embeds and searches
   with one model, so no query ever mixes the two. The old model keeps being written, so switching back
   is instant, until
5. **finish** takes it off the zone's fill list (its column keeps the old vectors until they are replaced).

Every step can be run again: start resumes a backfill; switch fills what is still missing first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from shardfuse.pipeline.config.settings import DEFAULT_MODEL, Settings
from shardfuse.pipeline.core.errors import ConfigurationError, EmbeddingProviderError
from shardfuse.pipeline.embed.stage import EmbeddingStage, unique_texts
from shardfuse.pipeline.index.store import ShardStore, zone_models
from shardfuse.pipeline.index.store.connections import pooled_connection, postgres_errors, postgres_location
from shardfuse.pipeline.index.store.embedding_columns import (
    column_dimensions,
    column_for,
    count_missing,
    index_for,
    missing_rows,
    set_fill_models,
    write_vectors,
)
from shardfuse.pipeline.index.store.schema import ensure_shared_schema, shard_schema
from shardfuse.pipeline.index.store.vector_index import BuildSettings, create_index_sql, index_valid
from shardfuse.pipeline.index.store.vector_types import shard_vector_type

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (chunks filled so far, chunks that were missing at the start)


@dataclass(frozen=True, slots=True)
class ShardReport:
    shard: int
    chunks: int
    missing: int
    index: bool


class ZoneReindex:
    """The steps of moving ``zone`` to ``model``, over ``stores`` (every shard) and the shared database."""

    def __init__(self, *, settings: Settings, stores: Sequence[ShardStore], shared_pool: Any, zone: str,
                 model: str, build: BuildSettings | None = None, batch_size: int = 256) -> None:
        settings.embedder_for(model)  # ConfigurationError for a model this process does not know
        self._settings = settings
        self._stores = stores
        self._shared = shared_pool
        self.zone = zone
        self.model = model
        self._build = build or BuildSettings()
        self._batch_size = batch_size

    def _shared_connection(self) -> Any:
        return pooled_connection(self._shared, what="the shared")

    def state(self) -> zone_models.ZoneModel:
        with self._shared_connection() as conn:
            ensure_shared_schema(conn)
            return zone_models.zone_model(conn, self.zone)

    def start(self) -> zone_models.ZoneModel:
        """Make ``model`` the zone's reindex target and every shard's writes of the zone fill its column."""
        with self._shared_connection() as conn:
            ensure_shared_schema(conn)
            state = zone_models.begin(conn, self.zone, self.model)
        self._fill((state.active, self.model))
        return state

    def _fill(self, models: Sequence[str]) -> None:
        wanted = list(dict.fromkeys(models))
        dimensions = {m: self._settings.embedder_for(m).dimensions for m in wanted}
        for store in self._stores:
            with pooled_connection(store.pool, what=f"shard {store.shard}") as conn:
                set_fill_models(conn, shard_schema(store.shard), store.shard, zone=self.zone, models=wanted,
                                dimensions=dimensions)

    def backfill(self, stage: EmbeddingStage, *, progress: Progress | None = None) -> int:
        """Embed and store the new model's vector of every chunk of the zone that lacks one; chunks filled."""
        total = sum(r.missing for r in self.report())
        filled = 0
        for store in self._stores:
            schema = sql.Identifier(shard_schema(store.shard))
            after = ""
            while True:
                with pooled_connection(store.pool, what=f"shard {store.shard}") as conn:
                    rows = missing_rows(conn, schema, zone=self.zone, model=self.model, after=after,
                                        limit=self._batch_size)
                if not rows:
                    break
                result = stage.embed(unique_texts((chunk_hash, text) for _, chunk_hash, text in rows),
                                     chunks=len(rows))
                if result.failed:
                    first = next(iter(result.failed.values()))
                    raise EmbeddingProviderError(f"embedding {len(result.failed)} chunk(s) of zone {self.zone!r} "
                                                 f"with {self.model!r} failed ({first}); run the step again")
                vectors = np.stack([result.vectors[chunk_hash] for _, chunk_hash, _ in rows]).astype(np.float32)
                with pooled_connection(store.pool, what=f"shard {store.shard}") as conn:
                    write_vectors(conn, schema, model=self.model, chunk_ids=[r[0] for r in rows], vectors=vectors)
                filled += len(rows)
                after = rows[-1][0]
                if progress is not None:
                    progress(filled, total)
        return filled

    def build_indexes(self) -> None:
        """An HNSW index over the model's column in every shard (concurrently: writes and searches go on)."""
        for store in self._stores:
            schema = shard_schema(store.shard)
            name = index_for(self.model)
            dsn = str(store.pool.conninfo)
            with (postgres_errors(f"shard {store.shard}", where=postgres_location(dsn)),
                  psycopg.connect(dsn, autocommit=True) as conn):
                if index_valid(conn, schema, name) is False:  # a build that failed earlier left it behind
                    conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {s}.{i}").format(
                        s=sql.Identifier(schema), i=sql.Identifier(name)))
                conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", (f"{self._build.memory_mb}MB",))
                column = column_for(self.model)
                conn.execute(create_index_sql(schema, self._build, concurrently=True, column=column, name=name,
                                              vector_type=shard_vector_type(conn, schema, column)))

    def report(self) -> list[ShardReport]:
        """Per shard: the zone's chunks, how many lack the model's vector, and whether its index is built."""
        reports = []
        for store in self._stores:
            schema = shard_schema(store.shard)
            with pooled_connection(store.pool, what=f"shard {store.shard}") as conn:
                if column_dimensions(conn, schema, self.model) is None:  # not started on this shard yet
                    chunks, _ = count_missing(conn, sql.Identifier(schema), zone=self.zone, model=DEFAULT_MODEL)
                    missing = chunks
                else:
                    chunks, missing = count_missing(conn, sql.Identifier(schema), zone=self.zone, model=self.model)
                index = index_valid(conn, schema, index_for(self.model)) is True
            reports.append(ShardReport(store.shard, chunks, missing, index))
        return reports

    def switch(self, stage: EmbeddingStage, *, progress: Progress | None = None) -> zone_models.ZoneModel:
        """Fill what is still missing, check every shard is complete and indexed, then make the model the
        zone's, in one statement."""
        state = self.state()
        if state.target != self.model:
            raise ConfigurationError(f"zone {self.zone!r} is not being reindexed to {self.model!r} (start it with "
                                     f"`shardfuse reindex start --zone {self.zone} --model {self.model}`)")
        self.backfill(stage, progress=progress)
        self.build_indexes()
        incomplete = [r for r in self.report() if r.missing or not r.index]
        if incomplete:  # writes keep both columns filled since start: only a failed step leaves gaps
            raise ConfigurationError(f"shards {[r.shard for r in incomplete]} are not complete for {self.model!r}: "
                                     "run `shardfuse reindex start` again")
        with self._shared_connection() as conn:
            return zone_models.switch(conn, self.zone, expected_target=self.model)

    def finish(self) -> zone_models.ZoneModel:
        """Stop writing the zone's previous model (after a switch): its writes then fill one column again."""
        state = self.state()
        if state.active != self.model or state.target is not None:
            raise ConfigurationError(f"zone {self.zone!r} uses {state.active!r}"
                                     + (f" and is being reindexed to {state.target!r}" if state.target else "")
                                     + f": finish applies once it has been switched to {self.model!r}")
        self._fill((self.model,))
        with self._shared_connection() as conn:
            return zone_models.forget_previous(conn, self.zone)

    def abort(self) -> zone_models.ZoneModel:
        """Give up a reindex before the switch: writes go back to the zone's model alone."""
        state = self.state()
        if state.target != self.model:
            raise ConfigurationError(f"zone {self.zone!r} is not being reindexed to {self.model!r}")
        self._fill((state.active,))
        with self._shared_connection() as conn:
            return zone_models.abort(conn, self.zone)

