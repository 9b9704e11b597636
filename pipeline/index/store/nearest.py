"""How a shard finds the nearest chunks of a zone that pass a filter: pgvector 0.8's iterative HNSW scan, or on
an older pgvector the plain HNSW scan with an exact scan behind it.

Every vector search is filtered: by its zone always, by ``path_prefix``/``metadata`` when the request asks. A
plain HNSW scan (pgvector before 0.8) looks at ``hnsw.ef_search`` candidates and filters *after* the graph
search, so a zone holding 1 % of a shard gets about ``ef_search / 100`` of them: short, and not its nearest.
pgvector 0.8 goes on scanning the graph until ``limit`` rows passed the filter (``hnsw.iterative_scan``), up
to ``hnsw.max_scan_tuples`` visited. ``relaxed_order`` returns them slightly out of order, so they are sorted
again here (:func:`.reads.vector_hits`), not by the server: pgvector's README sorts them in the statement
(a ``MATERIALIZED`` CTE, ``ORDER BY distance + 0``), which returns the same rows and cost a 2-shard search
0.30 ms more (2.52 against 2.22 ms, 100,000 chunks, ``ef_search`` 64, session 21). ``strict_order`` would stop
earlier and find fewer.

Which one runs is decided by the database's ``vector`` extension version, read once per pool
(:func:`connections.server_features`). A result can still come back short of ``limit`` while more rows pass:

- on 0.8, when the filter passes so few rows that the scan hit ``hnsw.max_scan_tuples`` first: the search is
  run once more allowed to visit the whole graph (a *widened* scan; still the index);
- before 0.8 — or should even the widened scan fall short (rows the graph cannot reach) — the query runs
  again as an exact scan with the index disabled: correct results first, speed second. On 0.8 that is logged
  as a warning: it is the case the benchmark ``tests/benchmarks/bench_filtered_vector.py`` counts.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql

from shardfuse.pipeline.index.store.connections import server_features, use_session_setting

log = logging.getLogger(__name__)

ITERATIVE_SCAN = "relaxed_order"
# A widened scan may visit every tuple of the graph (PostgreSQL's largest int setting), with this many times
# work_mem for the tuples it has seen (pgvector's default is 1: 4 MB, ~20,000 tuples of a 384-d halfvec).
WHOLE_GRAPH = 2**31 - 1
WIDENED_MEMORY_MULTIPLIER = 16

Row = tuple[str, float | None]
# The step a search statement's LIMIT is rounded up by (statement_limit).
LIMIT_STEP = 16


def nearest_rows(
    conn: psycopg.Connection[Any],
    schema: sql.Identifier,
    embedding: npt.NDArray[np.float32],
    *,
    zone: str,
    conditions: sql.Composable,
    condition_params: list[Any],
    limit: int,
    ef_search: int,
    column: str,
) -> list[Row]:
    """``(chunk_id, cosine similarity)`` of the chunks of ``zone`` nearest to ``embedding`` in ``column`` among those
    passing ``conditions`` (``AND ...`` SQL with ``condition_params``): at least the ``limit`` best, up to
    :func:`statement_limit` of them, in no particular order (:func:`.reads.vector_hits` sorts them)."""
    use_session_setting(conn, "hnsw.ef_search", str(max(ef_search, limit)))
    iterative = server_features(conn).iterative_scan
    params = nearest_params(embedding, zone, condition_params, iterative=iterative)
    if iterative:
        # A session setting, like ef_search: no transaction (and no round trips) around each search.
        use_session_setting(conn, "hnsw.iterative_scan", ITERATIVE_SCAN)
        query = nearest_statement(schema, conditions, column=column, iterative=True,
                                  limit=statement_limit(limit, ef_search))
        rows = conn.execute(query, params).fetchall()
        if not is_short(conn, rows, schema=schema, zone=zone, conditions=conditions,
                      condition_params=condition_params, limit=limit):  # fmt: skip
            return rows
        with conn.transaction():
            conn.execute("SELECT set_config('hnsw.max_scan_tuples', %s, true), "
                         "set_config('hnsw.scan_mem_multiplier', %s, true)",
                         (str(WHOLE_GRAPH), str(WIDENED_MEMORY_MULTIPLIER)))  # fmt: skip
            rows = conn.execute(query, params).fetchall()
        log.info("%s: the iterative scan of zone %s came back short; widened to the whole graph", schema, zone)
    else:
        query = nearest_statement(schema, conditions, column=column, iterative=False,
                                  limit=statement_limit(limit, ef_search))
        rows = conn.execute(query, params).fetchall()
    if not is_short(conn, rows, schema=schema, zone=zone, conditions=conditions, condition_params=condition_params,
                  limit=limit):  # fmt: skip
        return rows
    return _exact(conn, query, params, iterative=iterative, schema=schema, zone=zone)


def nearest_statement(schema: sql.Identifier, conditions: sql.Composable, *, column: str, iterative: bool, limit: int,
                      part: int | None = None) -> sql.Composed:
    """The nearest-chunks statement of one shard (its parameters: :func:`nearest_params`); with ``part``, each row
    starts with that tag and the statement is parenthesised, to be one part of a ``UNION ALL``
    (:mod:`.multi_shard`).

    ``limit`` is written into the statement, not passed as a parameter. psycopg prepares a statement after a few
    runs; PostgreSQL then plans it once (a generic plan) only when that plan looks no costlier than the plans it
    made for the runs' own values. A generic plan cannot know the ``LIMIT`` (the planner assumes a tenth of the
    rows), so once a table has statistics it looks costlier and loses, and every search was planned anew
    (``pg_prepared_statements``: 0 generic plans in 595 runs). With the limit written in, the generic plan is the
    plan: the server's CPU for one shard's search went from 0.63–0.73 to 0.57 ms, for a statement of two shards
    from 1.53–1.63 to 1.33–1.37 ms (300 queries each, 100,000 chunks in 4 shards, session 25). Callers pass
    :func:`statement_limit`, so that a few statements serve every request.
    """
    tag = sql.SQL("{}, ").format(sql.Literal(part)) if part is not None else sql.SQL("")
    if iterative:
        # Rows come back in the scan's relaxed order: vector_hits sorts them.
        query = sql.SQL(
            "SELECT {tag}chunk_id, 1 - distance FROM (SELECT chunk_id, {col} <=> %s AS distance FROM {s}.chunks "
            "WHERE zone = %s{c} ORDER BY distance LIMIT {limit}) nearest"
        ).format(s=schema, c=conditions, col=sql.Identifier(column), tag=tag, limit=sql.Literal(limit))
    else:
        query = sql.SQL(
            "SELECT {tag}chunk_id, 1 - ({col} <=> %s) FROM {s}.chunks WHERE zone = %s{c} ORDER BY {col} <=> %s "
            "LIMIT {limit}"
        ).format(s=schema, c=conditions, col=sql.Identifier(column), tag=tag, limit=sql.Literal(limit))
    return sql.SQL("({})").format(query) if part is not None else query


def statement_limit(limit: int, ef_search: int) -> int:
    """The ``LIMIT`` a search's statement is written with: ``limit`` rounded up to a multiple of
    :data:`LIMIT_STEP`, but never past the scan's ``hnsw.ef_search`` (``max(ef_search, limit)``), so a shard's best
    ``limit`` rows are the same. Unfiltered, the index scan does the same work too (it reads ``ef_search``
    candidates either way); a filtered iterative scan may read on until up to ``LIMIT_STEP - 1`` more rows pass.

    A request's leg depth takes many values (37 over 1,000 SciFact queries: the router scales it), and a
    statement per value kept few of them prepared long enough for the generic plan; written as it was, the
    limit made searches slower in 8 of 8 A/B pairs (session 25). Rounded, the same queries need 3.
    """
    return min(-(-limit // LIMIT_STEP) * LIMIT_STEP, max(ef_search, limit))


def nearest_params(embedding: npt.NDArray[np.float32], zone: str, condition_params: list[Any], *,
                   iterative: bool) -> list[Any]:
    """The parameters of :func:`nearest_statement`, in its placeholders' order."""
    if iterative:
        return [embedding, zone, *condition_params]
    return [embedding, zone, *condition_params, embedding]


def is_short(conn: psycopg.Connection[Any], rows: list[Row], *, schema: sql.Identifier, zone: str,
           conditions: sql.Composable, condition_params: list[Any], limit: int) -> bool:
    """Fewer than ``limit`` rows came back, and more than that many pass the filter (one ``count`` when
    fewer came back)."""
    if len(rows) >= limit:
        return False
    available = conn.execute(
        sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {s}.chunks WHERE zone = %s{c} LIMIT %s) t").format(
            s=schema, c=conditions),
        [zone, *condition_params, limit],
    ).fetchone()
    return available is not None and int(available[0]) > len(rows)


def _exact(conn: psycopg.Connection[Any], query: sql.Composed, params: list[Any], *, iterative: bool,
           schema: sql.Identifier, zone: str) -> list[Row]:
    if iterative:
        log.warning("%s: even a whole-graph scan missed chunks of zone %s; searched exactly", schema, zone)
    with conn.transaction():
        conn.execute("SELECT set_config('enable_indexscan', 'off', true)")
        # Not prepared: a plan made without the index must never be kept for later searches.
        return conn.execute(query, params, prepare=False).fetchall()
