"""What the query side reads from one shard: nearest chunks by vector, chunks by id, ids by filter.

Each function runs on a connection the caller lent in autocommit (:func:`connections.reading_connection`),
so a read is one round trip: no ``BEGIN``/``COMMIT`` around it, ``hnsw.ef_search`` kept by the connection's
session, and the statement prepared by psycopg after its first few runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql

from shardfuse.pipeline.index.store.connections import use_session_setting
from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.pipeline.ingest.symbols import ChunkSymbols

RECORD_COLUMNS = sql.SQL(
    "chunk_id, zone, path, start_line, end_line, text, metadata, symbols, language, heading_path"
)


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """A chunk as the query side shows it. ``metadata`` is its document's metadata (``{}`` when none);
    ``symbols``/``primary_symbol``/``role`` are what it defines when it is code (see
    :mod:`shardfuse.pipeline.ingest.symbols`), empty and None otherwise."""

    chunk_id: str
    zone: str
    path: str
    start_line: int
    end_line: int
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    symbols: tuple[str, ...] = ()
    primary_symbol: str | None = None
    role: str | None = None
    language: str | None = None
    heading_path: tuple[str, ...] = ()

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ChunkRecord:
        """From a row of :data:`RECORD_COLUMNS`."""
        chunk_id, zone, path, start_line, end_line, text, metadata, symbols, language, heading_path = row
        parsed = ChunkSymbols.from_json(symbols)
        return cls(
            chunk_id=chunk_id,
            zone=zone,
            path=path,
            start_line=start_line,
            end_line=end_line,
            text=text,
            metadata=metadata or {},
            symbols=parsed.symbols,
            primary_symbol=parsed.primary_symbol,
            role=None if parsed.role is None else parsed.role.value,
            language=language,
            heading_path=tuple(heading_path or ()),
        )


@dataclass(frozen=True, slots=True)
class VectorHit:
    chunk_id: str
    score: float


def vector_search(
    conn: psycopg.Connection[Any],
    schema: sql.Identifier,
    embedding: npt.NDArray[np.float32],
    *,
    zone: str,
    limit: int,
    ef_search: int,
    where: ChunkFilter | None = None,
    column: str = "embedding",
) -> list[VectorHit]:
    """Nearest chunks of ``zone`` by cosine similarity in ``column`` (the zone's embedding model's), best first.

    Only ids and scores: returning the chunks too, to save hydration's round trip, measured slower (100,000
    chunks, 4 shards): 120 rows decoded where ~50 are hydrated after fusion, their texts de-TOASTed by the
    server, cost more CPU than the round trip saves.

    pgvector 0.6's HNSW scan filters by zone *after* the graph search, so a small zone inside a large
    shard can come back short, and so can a filter (``where``) that few chunks match. When it does and
    more chunks match than were returned, the query is re-run as an exact scan: correct results first,
    speed second.
    """
    conditions, condition_params = (where or ChunkFilter()).sql()
    if column != "embedding":  # another model's column holds vectors only for the zones reindexed to it
        conditions = sql.SQL("{c} AND {col} IS NOT NULL").format(c=conditions, col=sql.Identifier(column))
    query = sql.SQL(
        "SELECT chunk_id, 1 - ({col} <=> %s) FROM {s}.chunks WHERE zone = %s{c} "
        "ORDER BY {col} <=> %s LIMIT %s"
    ).format(s=schema, c=conditions, col=sql.Identifier(column))
    params = [embedding, zone, *condition_params, embedding, limit]
    use_session_setting(conn, "hnsw.ef_search", str(max(ef_search, limit)))
    rows = conn.execute(query, params).fetchall()
    if len(rows) < limit:
        available = conn.execute(
            sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {s}.chunks WHERE zone = %s{c} LIMIT %s) t").format(
                s=schema, c=conditions),
            [zone, *condition_params, limit],
        ).fetchone()
        if available is not None and int(available[0]) > len(rows):
            with conn.transaction():
                conn.execute("SELECT set_config('enable_indexscan', 'off', true)")
                # Not prepared: a plan made without the index must never be kept for later searches.
                rows = conn.execute(query, params, prepare=False).fetchall()
    # A row without a vector in this column (a zone that left the model) has no distance: never a hit.
    return [VectorHit(chunk_id=r[0], score=float(r[1])) for r in rows if r[1] is not None]


def matching_chunk_ids(
    conn: psycopg.Connection[Any], schema: sql.Identifier, *, zone: str, where: ChunkFilter
) -> frozenset[str]:
    """Ids of the zone's chunks that pass ``where`` (the keyword leg masks its index with them)."""
    conditions, params = where.sql()
    rows = conn.execute(
        sql.SQL("SELECT chunk_id FROM {s}.chunks WHERE zone = %s{c}").format(s=schema, c=conditions),
        [zone, *params],
    ).fetchall()
    return frozenset(r[0] for r in rows)


def fetch_chunks(
    conn: psycopg.Connection[Any], schema: sql.Identifier, chunk_ids: Sequence[str], *, zone: str
) -> dict[str, ChunkRecord]:
    """Chunks by id, restricted to ``zone``; ids of chunks that no longer exist are absent."""
    rows = conn.execute(
        sql.SQL("SELECT {cols} FROM {s}.chunks WHERE chunk_id = ANY(%s) AND zone = %s").format(
            cols=RECORD_COLUMNS, s=schema),
        (list(chunk_ids), zone),
    ).fetchall()
    return {r[0]: ChunkRecord.from_row(r) for r in rows}
