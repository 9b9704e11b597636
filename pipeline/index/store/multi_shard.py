"""Reads of several shards that share one database, each as one statement: the shards' parts joined by ``UNION
ALL``, every row tagged with its part.

A query searches every shard. When shards live in one database (the embedded stack, or any deployment whose
``shard_dsns`` repeat a DSN), a statement per shard costs a round trip, a pooled connection and a thread hand-off
each; one statement for several shards costs them once. The server runs the parts of one statement one after
the other in one process, so the query side splits a database's shards over a few statements, as many as the
server has cores to run them at once (``query.statements_per_database``).

Each part is exactly the statement a single shard's read runs (:func:`.nearest.nearest_statement`,
:func:`.reads.fetch_chunks`), so the rows are the same. A vector search whose part came back short of
``limit`` is run again on its own shard through :func:`.nearest.nearest_rows`, which widens the scan or
searches exactly as it does for any short search.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql

from shardfuse.pipeline.index.store.connections import server_features, use_session_setting
from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.pipeline.index.store.nearest import (
    ITERATIVE_SCAN,
    Row,
    is_short,
    nearest_params,
    nearest_rows,
    nearest_statement,
    statement_limit,
)
from shardfuse.pipeline.index.store.reads import RECORD_COLUMNS, ChunkRecord, VectorHit, vector_conditions, vector_hits


def vector_search_shards(
    conn: psycopg.Connection[Any],
    schemas: Sequence[sql.Identifier],
    embedding: npt.NDArray[np.float32],
    *,
    zone: str,
    limit: int,
    ef_search: int,
    where: ChunkFilter | None = None,
    column: str = "embedding",
) -> list[list[VectorHit]]:
    """:func:`.reads.vector_search` of every schema in ``schemas``, in one statement: each schema's hits, in order."""
    conditions, condition_params = vector_conditions(where, column)
    use_session_setting(conn, "hnsw.ef_search", str(max(ef_search, limit)))
    iterative = server_features(conn).iterative_scan
    if iterative:
        use_session_setting(conn, "hnsw.iterative_scan", ITERATIVE_SCAN)
    parts: list[sql.Composable] = []
    params: list[Any] = []
    for part, schema in enumerate(schemas):
        parts.append(nearest_statement(schema, conditions, column=column, iterative=iterative,
                                       limit=statement_limit(limit, ef_search), part=part))
        params += nearest_params(embedding, zone, condition_params, iterative=iterative)
    rows: list[list[Row]] = [[] for _ in schemas]
    for part, chunk_id, similarity in conn.execute(sql.SQL(" UNION ALL ").join(parts), params).fetchall():
        rows[part].append((chunk_id, similarity))
    for part, schema in enumerate(schemas):
        if is_short(conn, rows[part], schema=schema, zone=zone, conditions=conditions,
                    condition_params=condition_params, limit=limit):  # fmt: skip
            # The single-shard search widens the scan, or searches exactly, as it would have on its own.
            rows[part] = nearest_rows(conn, schema, embedding, zone=zone, conditions=conditions,
                                      condition_params=condition_params, limit=limit, ef_search=ef_search,
                                      column=column)
    return [vector_hits(found)[:limit] for found in rows]


def fetch_chunks_shards(
    conn: psycopg.Connection[Any], asked: Sequence[tuple[sql.Identifier, Sequence[str], str]]
) -> list[dict[str, ChunkRecord]]:
    """:func:`.reads.fetch_chunks` of each ``(schema, chunk ids, zone)`` in ``asked``, in one statement: each
    part's chunks by id (ids of chunks that no longer exist are absent)."""
    parts = [
        sql.SQL("SELECT {part}, {cols} FROM {s}.chunks WHERE chunk_id = ANY(%s) AND zone = %s").format(
            part=sql.Literal(part), cols=RECORD_COLUMNS, s=schema)
        for part, (schema, _, _) in enumerate(asked)
    ]
    params: list[Any] = []
    for _, chunk_ids, zone in asked:
        params += [list(chunk_ids), zone]
    found: list[dict[str, ChunkRecord]] = [{} for _ in asked]
    for row in conn.execute(sql.SQL(" UNION ALL ").join(parts), params).fetchall():
        found[row[0]][row[1]] = ChunkRecord.from_row(row[1:])
    return found
