"""The real floor of a bulk ingest on this machine (``bench_ingest.py``): every row the pipeline wrote for a
zone, in every table of every shard, written again by bare binary ``COPY`` into tables of the same DDL
without any index, then every index the pipeline's tables carry built over them.

The tables and indexes are not listed here: they are read from the pipeline's own shards (each shard
table with a ``zone`` column; every index PostgreSQL holds on it, primary keys included, replayed from
``pg_get_indexdef`` / ``pg_get_constraintdef``), so a table or index the pipeline gains is in the floor
too. Shards run in parallel as the cores allow (one thread per shard, up to the core count; each build
gets the parallel maintenance workers the cores leave it), with the build memory the pipeline's deferred
build uses (``vector_index.build_memory_mb``).
"""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from shardfuse.pipeline.index.store.schema import ensure_shard_schema, shard_schema
from shardfuse.pipeline.index.store.vector_index import BuildSettings
from tests.benchmarks.scale import embedding_dimensions
from tests.integration.conftest import Stack


@dataclass(frozen=True)
class _Index:
    table: str
    name: str
    create: str  # the statement that builds it over a loaded table
    drop: str  # the statement that removes it from the empty table


@dataclass
class _Table:
    name: str
    columns: list[str]
    payload: bytes = b""
    rows: int = 0


@dataclass
class _Shard:
    shard: int
    tables: list[_Table] = field(default_factory=list)
    indexes: list[_Index] = field(default_factory=list)
    copy_s: float = 0.0
    build_s: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Floor:
    """What the floor took: rows per table (all shards), the wall seconds of the COPYs and builds together
    (the figure the pipeline is compared with), and per shard the COPY seconds and each index's build."""

    rows: dict[str, int]
    seconds: float
    copy_s: list[float]
    build_s: list[dict[str, float]]

    @property
    def chunks(self) -> int:
        return self.rows.get("chunks", 0)

    def parts(self) -> dict[str, float]:
        """Seconds by part, summed over the shards (they overlap in the wall time)."""
        out = {"copy": round(sum(self.copy_s), 2)}
        for builds in self.build_s:
            for name, seconds in builds.items():
                out[name] = round(out.get(name, 0.0) + seconds, 2)
        return out


def ingest_floor(stack: Stack, *, source_zone: str, cores: int | None = None) -> Floor:
    """Measure the floor for ``source_zone``'s rows of ``stack`` (see the module docstring)."""
    settings = stack.settings
    dsn = settings.postgres.dsn
    name = f"floor_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    target = dsn.rsplit("/", 1)[0] + f"/{name}"
    cores = cores or os.cpu_count() or 1
    threads = max(1, min(settings.shards, cores))
    build = BuildSettings(memory_mb=settings.vector_index.build_memory_mb, m=settings.vector_index.m,
                          ef_construction=settings.vector_index.ef_construction,
                          storage=settings.vector_index.storage)
    workers = max(0, cores // threads - 1)
    try:
        shards = _prepare(dsn, target, settings.shards, zone=source_zone, build=build)
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for done in [pool.submit(_load, target, s, memory_mb=build.memory_mb, workers=workers) for s in shards]:
                done.result()
        seconds = time.perf_counter() - started
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    rows: dict[str, int] = {}
    for s in shards:
        for table in s.tables:
            rows[table.name] = rows.get(table.name, 0) + table.rows
    return Floor(rows=rows, seconds=seconds, copy_s=[s.copy_s for s in shards], build_s=[s.build_s for s in shards])


def _prepare(dsn: str, target: str, count: int, *, zone: str, build: BuildSettings) -> list[_Shard]:
    """Each shard's tables in ``target`` (the pipeline's DDL, then every index dropped), and the zone's rows
    of every zoned table of the source shard read out as COPY BINARY payloads."""
    shards = []
    with psycopg.connect(dsn) as source, psycopg.connect(target, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        dimensions = embedding_dimensions(source)
        for number in range(count):
            schema = shard_schema(number)
            ensure_shard_schema(conn, number, dimensions=dimensions, build=build)
            shard = _Shard(number, indexes=_indexes(source, schema))
            for index in _indexes(conn, schema):
                conn.execute(index.drop)
            for table in _zoned_tables(source, schema):
                columns = sql.SQL(", ").join(map(sql.Identifier, table.columns))
                query = sql.SQL("COPY (SELECT {c} FROM {s}.{t} WHERE zone = %s) TO STDOUT (FORMAT BINARY)").format(
                    c=columns, s=sql.Identifier(schema), t=sql.Identifier(table.name))
                buffer = bytearray()
                with source.cursor().copy(query, (zone,)) as copy:
                    for block in copy:
                        buffer += block
                table.payload = bytes(buffer)
                count_sql = sql.SQL("SELECT count(*) FROM {s}.{t} WHERE zone = %s").format(
                    s=sql.Identifier(schema), t=sql.Identifier(table.name))
                row = source.execute(count_sql, (zone,)).fetchone()
                table.rows = int(row[0]) if row else 0
                shard.tables.append(table)
            source.rollback()
            shards.append(shard)
    return shards


def _load(target: str, shard: _Shard, *, memory_mb: int, workers: int) -> None:
    """The timed part of one shard: its tables' COPYs in one transaction, then each index built."""
    schema = sql.Identifier(shard_schema(shard.shard))
    with psycopg.connect(target) as conn:
        started = time.perf_counter()
        with conn.transaction():
            for table in shard.tables:
                columns = sql.SQL(", ").join(map(sql.Identifier, table.columns))
                statement = sql.SQL("COPY {s}.{t} ({c}) FROM STDIN (FORMAT BINARY)").format(
                    s=schema, t=sql.Identifier(table.name), c=columns)
                with conn.cursor().copy(statement) as copy:
                    view = memoryview(table.payload)
                    for start in range(0, len(view), 1 << 20):
                        copy.write(view[start:start + (1 << 20)])
        shard.copy_s = time.perf_counter() - started
        conn.autocommit = True
        conn.execute(f"SET maintenance_work_mem = '{memory_mb}MB'")
        conn.execute(f"SET max_parallel_maintenance_workers = {workers}")
        for index in shard.indexes:
            started = time.perf_counter()
            conn.execute(index.create)
            shard.build_s[f"{index.table}.{index.name}"] = time.perf_counter() - started


def _zoned_tables(conn: psycopg.Connection[Any], schema: str) -> list[_Table]:
    """The shard's tables that hold rows per zone (documents, chunks, grep blocks…), with their columns."""
    rows = conn.execute(
        "SELECT c.relname, array_agg(a.attname ORDER BY a.attnum) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped "
        "GROUP BY c.relname HAVING bool_or(a.attname = 'zone') ORDER BY c.relname",
        (schema,),
    ).fetchall()
    return [_Table(name=str(name), columns=list(columns)) for name, columns in rows]


def _indexes(conn: psycopg.Connection[Any], schema: str) -> list[_Index]:
    """Every index on the shard's zoned tables: primary keys as constraints, the rest as CREATE INDEX."""
    rows = conn.execute(
        "SELECT t.relname, i.relname, pg_get_indexdef(i.oid), con.conname, pg_get_constraintdef(con.oid) "
        "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
        "JOIN pg_namespace n ON n.oid = t.relnamespace "
        "LEFT JOIN pg_constraint con ON con.conindid = i.oid AND con.contype IN ('p', 'u') "
        "WHERE n.nspname = %s AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.oid "
        "AND a.attname = 'zone' AND NOT a.attisdropped) ORDER BY t.relname, i.relname",
        (schema,),
    ).fetchall()
    out = []
    for table, name, indexdef, constraint, constraintdef in rows:
        qualified = f'"{schema}"."{table}"'
        if constraint is not None:
            out.append(_Index(table, name, f'ALTER TABLE {qualified} ADD CONSTRAINT "{constraint}" {constraintdef}',
                              f'ALTER TABLE {qualified} DROP CONSTRAINT "{constraint}"'))
        else:
            out.append(_Index(table, name, indexdef, f'DROP INDEX "{schema}"."{name}"'))
    return out


