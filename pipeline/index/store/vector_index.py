"""A shard's HNSW index (and its grep blocks' GIN index): maintained row by row, or — for a load that is
large next to the shard — dropped for the load and built again after it.

pgvector adds a row to an HNSW graph at a cost far above the row's own write, while building the graph
over rows already in the table costs a fraction of that per row (measured on this project's 2-core test
machine, pgvector 0.6, 64 dimensions: 1.6 ms a row inserted vs 0.05 ms without the index, and 0.29 ms a row
to build the index afterwards — ``tests/benchmarks/bench_embed_batching.py::test_shard_write_floor``).
So writing ``n`` rows into a shard of ``s`` rows is cheaper without the index whenever
``n · insert ≥ (s + n) · build``, which :class:`DeferPolicy` decides with a margin. The grep blocks' GIN
index (:mod:`shardfuse.pipeline.index.store.grep_store`) goes and comes back with it: a block inserted into
the GIN index costs more than the index's build costs per block afterwards (each block adds ~1,000 trigram
entries; measured in issue 23, docs/performance.md), and a load large enough for the one is large enough
for the other.

While the index is deferred, searches of the shard stay exact (a sequential scan: pgvector without an
index; the grep leg reads every block of the zone) and writes skip the graph. A marker row in the shard's
``index_state`` table records the deferral, committed in the same transaction as the ``DROP INDEX``, so a
worker starting meanwhile does not rebuild the index in its start-up path; :func:`build_index` (a
maintenance task) builds it with ``CREATE INDEX CONCURRENTLY`` — writes go on during the build — and clears
the marker.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors, sql

from shardfuse.pipeline.config.settings import VectorStorage
from shardfuse.pipeline.index.store.connections import postgres_errors, postgres_location
from shardfuse.pipeline.index.store.grep_store import GREP_INDEX, create_grep_index_sql
from shardfuse.pipeline.index.store.vector_types import VectorType, cosine_opclass, shard_vector_type

log = logging.getLogger(__name__)

INDEX_NAME = "chunks_embedding_hnsw"
_MARKER = "hnsw"
# Any constant works; it only has to be the same in every process that builds indexes.
_BUILD_LOCK_KEY = 0x5348_4E53_5742_4C44


@dataclass(frozen=True, slots=True)
class DeferPolicy:
    """When a load skips the HNSW index: it brings at least ``min_rows`` rows and inserting them into the
    graph would cost more than building the graph over the whole shard after (``insert_to_build`` is the
    ratio of the two per-row costs, kept below the measured 5.5 so that borderline loads keep the index).
    ``min_rows`` 0 never defers."""

    min_rows: int = 2000
    insert_to_build: float = 4.0

    def should_defer(self, *, shard_rows: int, incoming_rows: int) -> bool:
        if self.min_rows <= 0 or incoming_rows < self.min_rows:
            return False
        return incoming_rows * self.insert_to_build >= max(0, shard_rows) + incoming_rows


@dataclass(frozen=True, slots=True)
class BuildSettings:
    """How a deferred index is built: graph parameters, and the memory and parallel workers of the build."""

    m: int = 16
    ef_construction: int = 64
    memory_mb: int = 512
    parallel_workers: int = 1
    storage: VectorStorage = "auto"  # the type of a new shard's embeddings (see vector_types)


def index_state_ddl(schema: str) -> sql.Composed:
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {s}.index_state (name text PRIMARY KEY, deferred_since timestamptz NOT NULL)"
    ).format(s=sql.Identifier(schema))


def create_index_sql(schema: str, build: BuildSettings, *, concurrently: bool, vector_type: VectorType,
                     column: str = "embedding", name: str = INDEX_NAME) -> sql.Composed:
    """The HNSW index over ``column`` (another model's column when a zone is reindexed), whose pgvector type
    is ``vector_type`` (:func:`shardfuse.pipeline.index.store.vector_types.column_type`)."""
    return sql.SQL(
        "CREATE INDEX {how} IF NOT EXISTS {name} ON {s}.chunks USING hnsw ({column} {opclass}) "
        "WITH (m = {m}, ef_construction = {ef})"
    ).format(
        how=sql.SQL("CONCURRENTLY" if concurrently else ""),
        opclass=sql.SQL(cosine_opclass(vector_type)),
        name=sql.Identifier(name),
        column=sql.Identifier(column),
        s=sql.Identifier(schema),
        m=sql.Literal(build.m),
        ef=sql.Literal(build.ef_construction),
    )


def is_deferred(conn: psycopg.Connection[Any], schema: str) -> bool:
    row = conn.execute(
        sql.SQL("SELECT 1 FROM {s}.index_state WHERE name = %s").format(s=sql.Identifier(schema)), (_MARKER,)
    ).fetchone()
    return row is not None


def row_estimate(conn: psycopg.Connection[Any], schema: str) -> int:
    """The planner's row count of the shard's ``chunks`` (0 for a table never analysed)."""
    row = conn.execute(
        "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
        (f"{sql.Identifier(schema).as_string(None)}.chunks",),
    ).fetchone()
    return max(0, int(row[0])) if row and row[0] is not None else 0


def defer_index(conn: psycopg.Connection[Any], schema: str, *, lock_timeout_s: float = 2.0) -> bool:
    """Record the deferral and drop the index, in one transaction. ``DROP INDEX`` needs the table to itself
    for a moment; when running searches hold it past ``lock_timeout_s``, nothing changes and False is
    returned (the load then goes on with the index)."""
    try:
        with conn.transaction():
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(lock_timeout_s * 1000)}ms",))
            conn.execute(
                sql.SQL("INSERT INTO {s}.index_state (name, deferred_since) VALUES (%s, now()) "
                        "ON CONFLICT (name) DO NOTHING").format(s=sql.Identifier(schema)),
                (_MARKER,),
            )
            for name in (INDEX_NAME, GREP_INDEX):
                conn.execute(sql.SQL("DROP INDEX IF EXISTS {s}.{name}").format(
                    s=sql.Identifier(schema), name=sql.Identifier(name)))
    except errors.LockNotAvailable:
        log.info("%s: searches held the table; the load keeps the HNSW index", schema)
        return False
    log.info("%s: HNSW index dropped for a bulk load (with the grep index); both are built again when the load "
             "is over", schema)
    return True


def build_index(dsn: str, schema: str, build: BuildSettings) -> float | None:
    """Build the deferred indexes — the grep blocks' GIN, then the HNSW graph — (``CREATE INDEX
    CONCURRENTLY``: writes and searches go on) and clear the marker; seconds taken, or None when another
    process is building them already.

    A build that failed earlier leaves an invalid index behind; it is dropped first. psycopg errors become
    ours (:func:`~shardfuse.pipeline.index.store.connections.postgres_errors`).
    """
    with postgres_errors(f"{schema}'s", where=lambda: postgres_location(dsn)):
        return _build(dsn, schema, build)


def _build(dsn: str, schema: str, build: BuildSettings) -> float | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        key = (schema, _BUILD_LOCK_KEY)
        locked = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, %s))", key).fetchone()
        if not locked or not locked[0]:
            return None
        try:
            started = time.monotonic()
            valid = index_valid(conn, schema)
            for name in (GREP_INDEX, INDEX_NAME):
                if index_valid(conn, schema, name) is False:
                    conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {s}.{name}").format(
                        s=sql.Identifier(schema), name=sql.Identifier(name)))
            conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", (f"{build.memory_mb}MB",))
            conn.execute("SELECT set_config('max_parallel_maintenance_workers', %s, false)",
                         (str(build.parallel_workers),))
            conn.execute(create_grep_index_sql(schema, concurrently=True))
            grep_s = time.monotonic() - started
            vector_type = shard_vector_type(conn, schema)
            conn.execute(create_index_sql(schema, build, concurrently=True, vector_type=vector_type))
            conn.execute(sql.SQL("DELETE FROM {s}.index_state WHERE name = %s").format(s=sql.Identifier(schema)),
                         (_MARKER,))
            seconds = time.monotonic() - started
            log.info("%s: grep and HNSW indexes built in %.1f s (grep %.1f s)", schema, seconds, grep_s)
            if valid is not True:
                _settle(conn, schema)
            return seconds
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, %s))", key)


def _settle(conn: psycopg.Connection[Any], schema: str) -> None:
    """``VACUUM (ANALYZE)`` the shard's tables after a bulk load, in the maintenance task that built its index.

    A freshly loaded table is otherwise vacuumed by autovacuum at a moment of its choosing: measured during
    a query benchmark at 100,000 chunks, it took PostgreSQL's CPU per query from 17.5 ms to 50–85 ms and
    p99 from 35 ms to over 200 ms. Vacuumed here, the rows' hint bits and visibility map are set and the
    planner's statistics describe the loaded table before queries arrive.
    """
    started = time.monotonic()
    conn.execute(sql.SQL("VACUUM (ANALYZE) {s}.chunks, {s}.documents, {s}.grep_blocks").format(
        s=sql.Identifier(schema)))
    log.info("%s: vacuumed and analysed after the load in %.1f s", schema, time.monotonic() - started)


def index_valid(conn: psycopg.Connection[Any], schema: str, name: str = INDEX_NAME) -> bool | None:
    """Whether the shard's index ``name`` is valid; None when there is none."""
    row = conn.execute(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (schema, name),
    ).fetchone()
    return None if row is None else bool(row[0])
