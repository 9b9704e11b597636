"""The grep index of one shard: the ``grep_blocks`` table (a document's text in blocks of whole lines, each
with its trigrams, :mod:`shardfuse.pipeline.index.store.grep_blocks`) and its GIN index; written in the
chunks' own transaction (:mod:`shardfuse.pipeline.index.store.writes`), read by the grep leg.

Neither embedded PostgreSQL wheel ships ``pg_trgm``, so the trigrams are ours: an ``int4[]`` per block under
the built-in GIN ``array_ops`` (``grams @> ARRAY[...]``). A block's rows live and die with its document's
chunks, so delivery, freshness, last-writer-wins, tombstones and sharding are exactly the chunks'.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg import pq, sql
from psycopg.adapt import Dumper

from shardfuse.pipeline.index.store.changes import DocumentChange
from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.pipeline.index.store.grep_blocks import block_rows

GREP_TABLE = "grep_blocks"
GREP_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.grep_blocks (
    zone        text    NOT NULL,
    path        text    NOT NULL,
    block       integer NOT NULL,
    seq         bigint  NOT NULL,
    start_line  integer NOT NULL,
    text        text    NOT NULL,
    chunk_lines integer[] NOT NULL,
    grams       integer[] NOT NULL,
    PRIMARY KEY (zone, path, block)
);
"""
GREP_INDEX = "grep_blocks_grams"
_GREP_INDEX_DDL = ("CREATE INDEX {how} IF NOT EXISTS {name} ON {schema}.grep_blocks USING gin (grams) "
                   "WITH (gin_pending_list_limit = 256)")
# gin_pending_list_limit (kB): every search reads the index's pending list (entries inserted but not yet merged
# into its tree) from end to end. At PostgreSQL's default of 4 MB that cost 80 ms per grep at 30,000 chunks
# right after a load, 5 ms once a VACUUM had merged it (tests/benchmarks/bench_grep.py); 256 kB keeps the list
# short while inserts still merge in batches.
BLOCK_COLUMNS: tuple[str, ...] = ("zone", "path", "block", "seq", "start_line", "text", "chunk_lines", "grams")
BLOCK_TYPES: tuple[str, ...] = ("text", "text", "int4", "int8", "int4", "text", "int4[]", "int4[]")


@dataclass(frozen=True, slots=True)
class CandidateBlock:
    """A block that holds every gram of one of the query's clauses: its lines still need verifying."""

    path: str
    block: int
    seq: int
    start_line: int
    text: str
    chunk_lines: tuple[int, ...]


def ensure_grep_table(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create the table and its GIN index with the shard, or add them to a shard created before them (only
    when missing: CREATE INDEX IF NOT EXISTS still takes a lock that queues the shard's writers). A bulk load
    drops the GIN index and builds it again after (:mod:`shardfuse.pipeline.index.store.vector_index`)."""
    if conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{GREP_TABLE}"',)).fetchone() == (None,):
        conn.execute(sql.SQL(GREP_DDL).format(schema=sql.Identifier(schema)))
        conn.execute(create_grep_index_sql(schema, concurrently=False))


def create_grep_index_sql(schema: str, *, concurrently: bool) -> sql.Composed:
    """The GIN index over the blocks' grams."""
    return sql.SQL(_GREP_INDEX_DDL).format(how=sql.SQL("CONCURRENTLY" if concurrently else ""),
                                           name=sql.Identifier(GREP_INDEX), schema=sql.Identifier(schema))


def delete_blocks(cur: psycopg.Cursor[Any], schema: sql.Identifier, keys: Sequence[tuple[str, str]]) -> None:
    """Drop the blocks of the documents ``keys`` (in the transaction that replaces their chunks)."""
    cur.execute(
        sql.SQL("DELETE FROM {s}.grep_blocks g USING unnest(%s::text[], %s::text[]) AS t(z, p) "
                "WHERE g.zone = t.z AND g.path = t.p").format(s=schema),
        ([z for z, _ in keys], [p for _, p in keys]),
    )


def copy_blocks(cur: psycopg.Cursor[Any], schema: sql.Identifier, writes: Sequence[DocumentChange]) -> None:
    """Binary-COPY the blocks of indexed changes (changes without blocks write none)."""
    if not any(c.blocks for c in writes):
        return
    copy_sql = sql.SQL("COPY {s}.grep_blocks ({cols}) FROM STDIN WITH (FORMAT BINARY)").format(
        s=schema, cols=sql.SQL(", ").join(map(sql.Identifier, BLOCK_COLUMNS)))
    cur.adapters.register_dumper(None, Int4ArrayDumper)  # the int4[] columns, by oid (set_types)
    with cur.copy(copy_sql) as copy:
        copy.set_types(list(BLOCK_TYPES))
        for change in writes:
            event = change.event
            for row in block_rows(zone=event.zone, path=event.path, seq=event.seq, blocks=change.blocks,
                                  chunks=change.chunks):
                copy.write_row(row)


class Int4ArrayDumper(Dumper):
    """``int4[]`` in PostgreSQL's binary array format, built by numpy from an array or a list of ints.

    A block carries ~1,000 grams: psycopg's own list dumper handles them one Python int at a time, which
    made the grep blocks the largest Python cost of a shard write (issue 23's profile). Written here: the
    format is five int32 header words (dimensions, has-nulls, element type, length, lower bound), then each
    element as its byte length (4) and its value, all big-endian; an empty array has no dimension."""

    format = pq.Format.BINARY
    oid = 1007  # int4[]

    def dump(self, obj: Any) -> bytes:
        values = np.asarray(obj, dtype=">i4")
        if values.ndim != 1:
            raise ValueError(f"an int4[] column takes a flat list of integers, not {values.ndim} dimensions")
        if not len(values):
            return np.array([0, 0, 23], dtype=">i4").tobytes()
        out = np.empty(5 + 2 * len(values), dtype=">i4")
        out[:5] = (1, 0, 23, len(values), 1)
        out[5::2] = 4
        out[6::2] = values
        return out.tobytes()


def candidate_blocks(
    conn: psycopg.Connection[Any],
    schema: sql.Identifier,
    *,
    zone: str,
    any_of: Sequence[Sequence[int]],
    where: ChunkFilter | None,
    after: tuple[str, int] | None,
    limit: int,
) -> list[CandidateBlock]:
    """Up to ``limit`` blocks of ``zone`` holding every gram of at least one clause of ``any_of`` (each clause
    should include the zone's pseudo-gram, so the GIN index narrows to the zone), passing ``where``, in
    ``(path, block)`` order after ``after``."""
    matching, params = _matching_sql(schema, zone=zone, any_of=any_of, where=where)
    page = sql.SQL(" AND (g.path, g.block) > (%s, %s)") if after else sql.SQL("")
    query = sql.SQL(
        "SELECT g.path, g.block, g.seq, g.start_line, g.text, g.chunk_lines FROM {s}.grep_blocks g "
        "WHERE {matching}{page} ORDER BY g.path, g.block LIMIT %s"
    ).format(s=schema, matching=matching, page=page)
    rows = conn.execute(query, [*params, *(after or ()), limit]).fetchall()
    return [CandidateBlock(path=r[0], block=r[1], seq=r[2], start_line=r[3], text=r[4], chunk_lines=tuple(r[5]))
            for r in rows]


def count_candidate_blocks(
    conn: psycopg.Connection[Any],
    schema: sql.Identifier,
    *,
    zone: str,
    any_of: Sequence[Sequence[int]],
    where: ChunkFilter | None,
    cap: int,
) -> int:
    """How many blocks :func:`candidate_blocks` would find, counted up to ``cap`` (at most ``cap``; ``cap`` means
    "that many or more"). Only the GIN index and the rows' visibility are read, no block text, and nothing is
    sorted: the hybrid grep leg asks it before reading any of a token's blocks."""
    matching, params = _matching_sql(schema, zone=zone, any_of=any_of, where=where)
    query = sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {s}.grep_blocks g WHERE {matching} LIMIT %s) t").format(
        s=schema, matching=matching)
    row = conn.execute(query, [*params, cap]).fetchone()
    return int(row[0]) if row else 0


def _matching_sql(schema: sql.Identifier, *, zone: str, any_of: Sequence[Sequence[int]],
                  where: ChunkFilter | None) -> tuple[sql.Composable, list[Any]]:
    """The condition on ``grep_blocks g`` both reads share: in ``zone``, holding every gram of a clause of
    ``any_of``, passing ``where``; with its parameters."""
    clauses = sql.SQL(" OR ").join(sql.SQL("g.grams @> %s::int4[]") for _ in any_of)
    conditions, params = _filter_sql(schema, where)
    condition = sql.SQL("g.zone = %s AND ({clauses}){c}").format(clauses=clauses, c=conditions)
    return condition, [zone, *(list(c) for c in any_of), *params]


def _filter_sql(schema: sql.Identifier, where: ChunkFilter | None) -> tuple[sql.Composable, list[Any]]:
    """``where`` on ``grep_blocks g``, as :meth:`ChunkFilter.sql` puts it on ``chunks``: the path prefix on the
    block's own path, the metadata filters on its document's row (the chunks' metadata is their document's)."""
    parts: list[sql.Composable] = []
    params: list[Any] = []
    if where and where.path_prefix:
        escaped = where.path_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        parts.append(sql.SQL(" AND g.path LIKE %s ESCAPE '\\'"))
        params.append(escaped + "%")
    if where and where.metadata:
        parts.append(sql.SQL(" AND EXISTS (SELECT 1 FROM {s}.documents d WHERE d.zone = g.zone AND d.path = g.path "
                             "AND d.metadata @> %s::jsonb)").format(s=schema))
        params.append(json.dumps(where.metadata))
    return sql.Composed(parts), params
