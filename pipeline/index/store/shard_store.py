"""The PostgreSQL + pgvector adapter for one shard."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.config.settings import DEFAULT_MODEL
from shardfuse.pipeline.index.store import embedding_columns, reads, vector_index, vector_types
from shardfuse.pipeline.index.store.changes import ApplyOutcome, DocStatus, DocumentChange
from shardfuse.pipeline.index.store.connections import pooled_connection, reading_connection
from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.pipeline.index.store.reads import ChunkRecord, VectorHit
from shardfuse.pipeline.index.store.rows import CHUNK_COLUMNS, chunk_rows, chunk_types
from shardfuse.pipeline.index.store.schema import ensure_shard_schema, shard_schema
from shardfuse.pipeline.index.store.vector_index import BuildSettings


def _newer(change: DocumentChange, stored_seq: int) -> bool:
    """The version rule: a change applies when its seq is newer than the shard's (or equal, for a refresh
    of what the shard holds)."""
    seq = change.event.seq
    return seq > stored_seq or (change.refresh and seq == stored_seq)


def _fenced(change: DocumentChange, stored_fence: int) -> bool:
    """The fencing rule: a change written under a lease older than the newest one the shard has seen is
    refused (its writer's lease lapsed and another took over)."""
    return change.fence is not None and change.fence < stored_fence


def _missing_models(change: DocumentChange, required: tuple[str, ...]) -> tuple[str, ...]:
    """The models the zone's writes must fill that an indexed change has no vectors of."""
    if change.status is not DocStatus.INDEXED or not change.chunks:
        return ()
    return tuple(m for m in required if m not in change.models)


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

    def build_vector_index(self) -> float | None:
        return vector_index.build_index(str(self.pool.conninfo), shard_schema(self.shard), self.index)

    # -- writes --------------------------------------------------------------------------------------
    def apply(self, changes: Sequence[DocumentChange]) -> list[ApplyOutcome]:
        """Apply document changes in one transaction; a change older than what the shard holds is a no-op.

        Rows are locked in ``(zone, path)`` order so that concurrent batches touching the same documents
        queue behind each other instead of deadlocking.
        """
        latest: dict[tuple[str, str], DocumentChange] = {}
        for change in changes:
            held = latest.get(change.key)
            if held is None or change.event.seq > held.event.seq:
                latest[change.key] = change
        keys = sorted(latest)
        if not keys:
            return []
        zones = [k[0] for k in keys]
        paths = [k[1] for k in keys]
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            # Which embedding columns each zone's writes fill; the list cannot change before this commits.
            embedding_columns.lock_shared(cur, self.shard)
            required = embedding_columns.required_models(cur, self._schema, zones)
            # A placeholder row (seq -1) gives a never-seen document something to lock; it is replaced
            # below in the same transaction, so no reader ever sees it.
            cur.execute(
                self._q(
                    "INSERT INTO {s}.documents (zone, path, seq, status) "
                    "SELECT z, p, -1, 'pending' FROM unnest(%s::text[], %s::text[]) AS t(z, p) "
                    "ORDER BY z, p ON CONFLICT (zone, path) DO NOTHING"
                ),
                (zones, paths),
            )
            cur.execute(
                self._q(
                    "SELECT d.zone, d.path, d.seq, d.fence FROM {s}.documents d "
                    "JOIN unnest(%s::text[], %s::text[]) AS t(z, p) ON d.zone = t.z AND d.path = t.p "
                    "ORDER BY d.zone, d.path FOR UPDATE OF d"
                ),
                (zones, paths),
            )
            rows = cur.fetchall()
            stored = {(z, p): int(seq) for z, p, seq, _ in rows}
            fences = {(z, p): int(fence) for z, p, _, fence in rows}
            fenced = {k for k in keys if _fenced(latest[k], fences[k])}
            missing = {k: m for k in keys if k not in fenced and _newer(latest[k], stored[k])
                       and (m := _missing_models(latest[k], required[k[0]]))}
            fresh = [latest[k] for k in keys if k not in fenced and k not in missing and _newer(latest[k], stored[k])]
            if fresh:
                self._replace(cur, fresh, required)
            # A stale change's token still counts: the shard remembers the newest lease that reached it.
            fresh_keys = {c.key for c in fresh}
            self._raise_fences(cur, [latest[k] for k in keys if k not in fenced and k not in fresh_keys
                                     and (latest[k].fence or 0) > fences[k]])
        return [
            ApplyOutcome(
                key=k,
                seq=latest[k].event.seq,
                applied=k not in fenced and k not in missing and _newer(latest[k], stored[k]),
                stored_seq=None if stored[k] < 0 else stored[k],
                fenced=k in fenced,
                stored_fence=fences[k],
                missing_models=missing.get(k, ()),
            )
            for k in keys
        ]

    def _raise_fences(self, cur: psycopg.Cursor[Any], changes: list[DocumentChange]) -> None:
        if changes:
            cur.executemany(
                self._q("UPDATE {s}.documents SET fence = %s WHERE zone = %s AND path = %s AND fence < %s"),
                [(c.fence, c.event.zone, c.event.path, c.fence) for c in changes],
            )

    def _replace(self, cur: psycopg.Cursor[Any], fresh: list[DocumentChange],
                 required: dict[str, tuple[str, ...]]) -> None:
        cur.execute(
            self._q(
                "DELETE FROM {s}.chunks c USING unnest(%s::text[], %s::text[]) AS t(z, p) "
                "WHERE c.zone = t.z AND c.path = t.p"
            ),
            ([c.event.zone for c in fresh], [c.event.path for c in fresh]),
        )
        writes = [c for c in fresh if c.status is DocStatus.INDEXED and c.chunks]
        if writes:
            # Other models' columns, for the zones whose writes fill them (most writes: none).
            others = sorted({m for c in writes for m in required[c.event.zone] if m != DEFAULT_MODEL})
            columns = [*CHUNK_COLUMNS, *map(embedding_columns.column_for, others)]
            copy_sql = sql.SQL("COPY {s}.chunks ({cols}) FROM STDIN WITH (FORMAT BINARY)").format(
                s=self._schema, cols=sql.SQL(", ").join(map(sql.Identifier, columns))
            )
            vector_type = self._vector_type_of(cur.connection)
            vector = vector_types.copy_value(vector_type)
            with cur.copy(copy_sql) as copy:
                copy.set_types([*chunk_types(vector_type), *(vector_type for _ in others)])
                for change in writes:
                    for row in chunk_rows(change, others, vector=vector):
                        copy.write_row(row)
        cur.executemany(
            self._q(
                "UPDATE {s}.documents SET seq = %s, status = %s, content_hash = %s, event_id = %s, "
                "size = %s, mime = %s, reason = %s, chunk_count = %s, token_count = %s, line_count = %s, "
                "metadata = %s, dropped = %s, fence = greatest(fence, %s), updated_at = now() "
                "WHERE zone = %s AND path = %s"
            ),
            [
                (
                    c.event.seq,
                    c.status.value,
                    c.event.content_hash,
                    c.event.event_id,
                    c.event.size,
                    c.event.mime,
                    c.reason,
                    len(c.chunks),
                    sum(ch.token_count for ch in c.chunks),
                    c.line_count,
                    Jsonb(c.event.metadata) if c.event.metadata else None,
                    Jsonb(c.dropped) if c.dropped else None,
                    c.fence or 0,
                    c.event.zone,
                    c.event.path,
                )
                for c in fresh
            ],
        )

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
