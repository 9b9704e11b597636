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

from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.pipeline.index.store.nearest import Row, nearest_rows
from shardfuse.pipeline.ingest.symbols import ChunkSymbols, SymbolLines

RECORD_COLUMNS = sql.SQL(
    "chunk_id, zone, path, start_line, end_line, text, metadata, symbols, language, heading_path, context"
)


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """A chunk as the query side shows it. ``metadata`` is its document's metadata (``{}`` when none);
    ``symbols``/``primary_symbol``/``role`` are what it defines when it is code (see
    :mod:`shardfuse.pipeline.ingest.symbols`), empty and None otherwise; ``symbol_lines`` where each definition
    is, relative to ``start_line`` (empty for prose, and for chunks stored before lines were)."""

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
    # The situating context indexed in front of the text (Chunk.indexed_text); "" when none. Rerankers read it.
    context: str = ""
    symbol_lines: tuple[SymbolLines, ...] = ()

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ChunkRecord:
        """From a row of :data:`RECORD_COLUMNS`."""
        chunk_id, zone, path, start_line, end_line, text, metadata, symbols, language, heading_path, context = row
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
            context=context or "",
            symbol_lines=parsed.lines,
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

    The scan is pgvector 0.8's iterative HNSW scan where the database has it, so a small zone inside a large
    shard, or a filter (``where``) that few chunks match, still gets its nearest chunks from the index; an
    older pgvector falls back to an exact scan when the index comes back short (:mod:`.nearest`).
    """
    conditions, condition_params = vector_conditions(where, column)
    rows = nearest_rows(conn, schema, embedding, zone=zone, conditions=conditions, condition_params=condition_params,
                        limit=limit, ef_search=ef_search, column=column)
    return vector_hits(rows)[:limit]


def vector_conditions(where: ChunkFilter | None, column: str) -> tuple[sql.Composable, list[Any]]:
    """The vector leg's conditions: ``where``, and for another model's column, rows that have a vector in it
    (it holds vectors only for the zones reindexed to that model)."""
    conditions, condition_params = (where or ChunkFilter()).sql()
    if column != "embedding":
        conditions = sql.SQL("{c} AND {col} IS NOT NULL").format(c=conditions, col=sql.Identifier(column))
    return conditions, list(condition_params)


def vector_hits(rows: Sequence[Row]) -> list[VectorHit]:
    """Rows as hits, best first (an iterative scan returns them in a relaxed order: :mod:`.nearest`), equal scores
    in the order the server returned them; a row without a vector in the column (a zone that left the model) has
    no distance: never a hit."""
    hits = [VectorHit(chunk_id=r[0], score=float(r[1])) for r in rows if r[1] is not None]
    hits.sort(key=lambda hit: -hit.score)  # stable
    return hits


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
