"""The PostgreSQL + pgvector adapter for one shard."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.config.settings import DEFAULT_MODEL
from shardfuse.pipeline.index.store import (
    change_log,
    embedding_columns,
    grep_store,
    reads,
    vector_index,
    vector_types,
    writes,
)
from shardfuse.pipeline.index.store.change_log import ChangeSet, Lag
from shardfuse.pipeline.index.store.changes import ApplyOutcome, DocumentChange
from shardfuse.pipeline.index.store.connections import pooled_connection, reading_connection
from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.pipeline.index.store.grep_store import CandidateBlock
from shardfuse.pipeline.index.store.reads import ChunkRecord, VectorHit
from shardfuse.pipeline.index.store.schema import ensure_shard_schema, shard_schema
from shardfuse.pipeline.index.store.vector_index import BuildSettings

# What BM25 indexes is what was embedded: the situating context, then the chunk.
_INDEXED_TEXT = "CASE WHEN context = '' THEN text ELSE context || E'\\n\\n' || text END"


class ShardStore:
    """Reads and writes one shard's ``documents`` and ``chunks`` tables.

    Every write of a batch happens in one transaction, so a reader sees a document's old chunks or its new
    ones, never a mix and never none (PostgreSQL MVCC: each statement reads one snapshot).
    """

    def __init__(self, pool: ConnectionPool, shard: int, *, dimensions: int,
                 index: BuildSettings | None = None) -> None:
        self.pool = pool
        self.shard = shard
        self.dimensions = dimensions
        self.index = index or BuildSettings()
        self._schema = sql.Identifier(shard_schema(shard))
        self._vector_type: vector_types.VectorType | None = None  # fixed when the shard was created

    def _q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(s=self._schema)

    def ensure_schema(self) -> None:
        with self._connection() as conn:
            self._vector_type = ensure_shard_schema(conn, self.shard, dimensions=self.dimensions, build=self.index)

    def _vector_type_of(self, conn: psycopg.Connection[Any]) -> vector_types.VectorType:
        """The pgvector type of the shard's embeddings (read once: a shard keeps the type it was created with)."""
        if self._vector_type is None:
            self._vector_type = vector_types.shard_vector_type(conn, shard_schema(self.shard))
        return self._vector_type

    # -- the HNSW index (shardfuse.pipeline.index.store.vector_index)
    # ----------------------------------------------------
    def vector_index_deferred(self) -> bool:
        with self._connection() as conn:
            return vector_index.is_deferred(conn, shard_schema(self.shard))

    def row_estimate(self) -> int:
        with self._connection() as conn:
            return vector_index.row_estimate(conn, shard_schema(self.shard))

    def defer_vector_index(self) -> bool:
        with self._connection() as conn:
            return vector_index.defer_index(conn, shard_schema(self.shard))

    def build_vector_index(self, *, parallel_workers: int | None = None) -> float | None:
        """Build the indexes a bulk load deferred; ``parallel_workers`` overrides the configured ones (when
        several shards build at once)."""
        build = self.index if parallel_workers is None else replace(self.index, parallel_workers=parallel_workers)
        return vector_index.build_index(str(self.pool.conninfo), shard_schema(self.shard), build)

    # -- writes --------------------------------------------------------------------------------------
    def apply(self, changes: Sequence[DocumentChange]) -> list[ApplyOutcome]:
        """Apply document changes in one transaction; a change older than what the shard holds is a no-op
        (:func:`~shardfuse.pipeline.index.store.writes.apply_changes`: version rule, fencing, embedding models).

        Returns one outcome per distinct document, for its newest change, in ``(zone, path)`` order.
        """
        if not changes:
            return []
        with self._connection() as conn:
            return writes.apply_changes(conn, self._schema, self.shard, changes, vector_type_of=self._vector_type_of)

    # -- reads ---------------------------------------------------------------------------------------
    def document_seq(self, zone: str, path: str) -> int | None:
        """The ``seq`` the shard holds for a document (tombstones included), or None if never seen."""
        with self._connection() as conn:
            row = conn.execute(
                self._q("SELECT seq FROM {s}.documents WHERE zone = %s AND path = %s AND seq >= 0"),
                (zone, path),
            ).fetchone()
        return None if row is None else int(row[0])

    def document_seqs(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """:meth:`document_seq` of many documents in one query: the ``(zone, path)`` the shard has seen,
        with their ``seq`` (documents never seen are absent)."""
        if not keys:
            return {}
        with self._connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT d.zone, d.path, d.seq FROM {s}.documents d "
                    "JOIN unnest(%s::text[], %s::text[]) AS t(z, p) ON d.zone = t.z AND d.path = t.p "
                    "WHERE d.seq >= 0"
                ),
                ([k[0] for k in keys], [k[1] for k in keys]),
            ).fetchall()
        return {(z, p): int(seq) for z, p, seq in rows}

    def vector_search(
        self,
        embedding: npt.NDArray[np.float32],
        *,
        zone: str,
        limit: int,
        ef_search: int,
        where: ChunkFilter | None = None,
        model: str = DEFAULT_MODEL,
    ) -> list[VectorHit]:
        """Nearest chunks of ``zone`` by cosine similarity in ``model``'s column, best first (see
        :func:`reads.vector_search`)."""
        with self._reading() as conn:
            return reads.vector_search(conn, self._schema, embedding, zone=zone, limit=limit, ef_search=ef_search,
                                       where=where, column=embedding_columns.column_for(model))

    def fill_models(self) -> dict[str, tuple[str, ...]]:
        """The zones whose writes fill other embedding columns than the default one, with those models."""
        with self._reading() as conn:
            return embedding_columns.fill_models(conn, self._schema)

    def matching_chunk_ids(self, *, zone: str, where: ChunkFilter) -> frozenset[str]:
        """Ids of the zone's chunks that pass ``where`` (the keyword leg masks its index with them)."""
        with self._reading() as conn:
            return reads.matching_chunk_ids(conn, self._schema, zone=zone, where=where)

    def grep_blocks(self, *, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None = None,
                    after: tuple[str, int] | None = None, limit: int) -> list[CandidateBlock]:
        """Blocks of the grep index holding every gram of a clause of ``any_of``, in ``(path, block)`` order
        (:func:`grep_store.candidate_blocks`)."""
        with self._reading() as conn:
            return grep_store.candidate_blocks(conn, self._schema, zone=zone, any_of=any_of, where=where, after=after,
                                               limit=limit)

    def count_grep_blocks(self, *, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None = None,
                          cap: int) -> int:
        """How many blocks :meth:`grep_blocks` would find, counted up to ``cap``
        (:func:`grep_store.count_candidate_blocks`)."""
        with self._reading() as conn:
            return grep_store.count_candidate_blocks(conn, self._schema, zone=zone, any_of=any_of, where=where, cap=cap)

    def fetch_chunks(self, chunk_ids: Sequence[str], *, zone: str) -> dict[str, ChunkRecord]:
        """Chunks by id, restricted to ``zone``. Ids of chunks that no longer exist (replaced since the
        BM25 generation that returned them was built) are simply absent."""
        if not chunk_ids:
            return {}
        with self._reading() as conn:
            return reads.fetch_chunks(conn, self._schema, chunk_ids, zone=zone)

    def iter_lexical_rows(self, *, batch_size: int = 5000) -> Iterator[tuple[str, str, str, str]]:
        """Every chunk's ``(chunk_id, zone, path, text)`` for a BM25 build, streamed by a server-side cursor
        from one snapshot (the path lets a later delta mask a rewritten document's rows)."""
        with (
            self._connection() as conn,
            conn.transaction(),
            conn.cursor(name=f"bm25_shard_{self.shard}") as cur,
        ):
            cur.itersize = batch_size
            cur.execute(self._q(f"SELECT chunk_id, zone, path, {_INDEXED_TEXT} FROM {{s}}.chunks ORDER BY chunk_id"))
            yield from cur

    def lexical_rows_for(self, keys: Iterable[tuple[str, str]]) -> list[tuple[str, str, str, str]]:
        """The current chunks of the documents ``keys`` (``(zone, path)``; absent ones have none), as
        :meth:`iter_lexical_rows` gives them: what a BM25 delta indexes."""
        pairs = sorted(set(keys))
        if not pairs:
            return []
        with self._connection() as conn:
            return conn.execute(
                self._q(
                    f"SELECT chunk_id, zone, path, {_INDEXED_TEXT} FROM unnest(%s::text[], %s::text[]) AS t(z, p) "
                    "JOIN {s}.chunks ON zone = t.z AND path = t.p ORDER BY chunk_id"
                ),
                ([z for z, _ in pairs], [p for _, p in pairs]),
            ).fetchall()

    # -- what changed (shardfuse.pipeline.index.store.change_log) ----------------------------------------
    def change_mark(self) -> ChangeSet:
        """The database's snapshot of this moment: what a full BM25 build reads from."""
        with self._reading() as conn:
            return change_log.current_mark(conn)

    def changes_since(self, mark: str) -> ChangeSet:
        """The documents changed since snapshot ``mark``, with the snapshot they were read in."""
        with self._reading() as conn:
            return change_log.changes_since(conn, self._schema, mark)

    def lexical_lag(self, mark: str | None) -> Lag:
        """How far a BM25 index built at snapshot ``mark`` (None: no usable one) is behind this shard."""
        with self._reading() as conn:
            return change_log.lag(conn, self._schema, mark)

    def zone_counts(self) -> list[dict[str, Any]]:
        """Per zone: indexed, skipped and deleted documents, and chunks."""
        with self._connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT zone, count(*) FILTER (WHERE status = 'indexed'), "
                    "count(*) FILTER (WHERE status = 'skipped'), count(*) FILTER (WHERE status = 'deleted'), "
                    "coalesce(sum(chunk_count) FILTER (WHERE status = 'indexed'), 0) "
                    "FROM {s}.documents WHERE seq >= 0 GROUP BY zone ORDER BY zone"
                )
            ).fetchall()
        return [
            {"zone": r[0], "documents": r[1], "skipped": r[2], "deleted": r[3], "chunks": int(r[4])}
            for r in rows
        ]

    def skipped_documents(self, *, limit: int = 20) -> list[dict[str, Any]]:
        with self._connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT zone, path, reason, updated_at FROM {s}.documents WHERE status = 'skipped' "
                    "ORDER BY updated_at DESC LIMIT %s"
                ),
                (limit,),
            ).fetchall()
        return [{"zone": r[0], "path": r[1], "reason": r[2], "at": r[3].isoformat()} for r in rows]

    def _connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return pooled_connection(self.pool, what=f"shard {self.shard}")

    def _reading(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return reading_connection(self.pool, what=f"shard {self.shard}")
