"""The PostgreSQL + pgvector adapter for one shard."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from pipeline.store import vector_index
from pipeline.store.changes import ApplyOutcome, DocStatus, DocumentChange
from pipeline.store.connections import pooled_connection, reading_connection, use_session_setting
from pipeline.store.filters import ChunkFilter
from pipeline.store.rows import CHUNK_COLUMNS, CHUNK_TYPES, chunk_rows
from pipeline.store.schema import ensure_shard_schema, shard_schema
from pipeline.store.vector_index import BuildSettings
from pipeline.symbols import ChunkSymbols


@dataclass(frozen=True, slots=True)
class VectorHit:
    chunk_id: str
    score: float


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """A chunk as the query side shows it. ``metadata`` is its document's metadata (``{}`` when none);
    ``symbols``/``primary_symbol``/``role`` are what it defines when it is code (see
    :mod:`pipeline.symbols`), empty and None otherwise."""

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
        """From a row of :data:`_RECORD_COLUMNS`."""
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


def _newer(change: DocumentChange, stored_seq: int) -> bool:
    """The version rule: a change applies when its seq is newer than the shard's (or equal, for a refresh
    of what the shard holds)."""
    seq = change.event.seq
    return seq > stored_seq or (change.refresh and seq == stored_seq)


def _fenced(change: DocumentChange, stored_fence: int) -> bool:
    """The fencing rule: a change written under a lease older than the newest one the shard has seen is
    refused (its writer's lease lapsed and another took over)."""
    return change.fence is not None and change.fence < stored_fence


_RECORD_COLUMNS = sql.SQL(
    "chunk_id, zone, path, start_line, end_line, text, metadata, symbols, language, heading_path"
)


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

    def _q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(s=self._schema)

    def ensure_schema(self) -> None:
        with self._connection() as conn:
            ensure_shard_schema(conn, self.shard, dimensions=self.dimensions, build=self.index)

    # -- the HNSW index (pipeline.store.vector_index) ----------------------------------------------------
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
            fresh = [latest[k] for k in keys if k not in fenced and _newer(latest[k], stored[k])]
            if fresh:
                self._replace(cur, fresh)
            # A stale change's token still counts: the shard remembers the newest lease that reached it.
            fresh_keys = {c.key for c in fresh}
            self._raise_fences(cur, [latest[k] for k in keys if k not in fenced and k not in fresh_keys
                                     and (latest[k].fence or 0) > fences[k]])
        return [
            ApplyOutcome(
                key=k,
                seq=latest[k].event.seq,
                applied=k not in fenced and _newer(latest[k], stored[k]),
                stored_seq=None if stored[k] < 0 else stored[k],
                fenced=k in fenced,
                stored_fence=fences[k],
            )
            for k in keys
        ]

    def _raise_fences(self, cur: psycopg.Cursor[Any], changes: list[DocumentChange]) -> None:
        if changes:
            cur.executemany(
                self._q("UPDATE {s}.documents SET fence = %s WHERE zone = %s AND path = %s AND fence < %s"),
                [(c.fence, c.event.zone, c.event.path, c.fence) for c in changes],
            )

    def _replace(self, cur: psycopg.Cursor[Any], fresh: list[DocumentChange]) -> None:
        cur.execute(
            self._q(
                "DELETE FROM {s}.chunks c USING unnest(%s::text[], %s::text[]) AS t(z, p) "
                "WHERE c.zone = t.z AND c.path = t.p"
            ),
            ([c.event.zone for c in fresh], [c.event.path for c in fresh]),
        )
        writes = [c for c in fresh if c.status is DocStatus.INDEXED and c.chunks]
        if writes:
            copy_sql = sql.SQL("COPY {s}.chunks ({cols}) FROM STDIN WITH (FORMAT BINARY)").format(
                s=self._schema, cols=sql.SQL(", ").join(map(sql.Identifier, CHUNK_COLUMNS))
            )
            with cur.copy(copy_sql) as copy:
                copy.set_types(list(CHUNK_TYPES))
                for change in writes:
                    for row in chunk_rows(change):
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
    ) -> list[VectorHit]:
        """Nearest chunks of ``zone`` by cosine similarity, best first.

        pgvector 0.6's HNSW scan filters by zone *after* the graph search, so a small zone inside a large
        shard can come back short, and so can a filter (``where``) that few chunks match. When it does and
        more chunks match than were returned, the query is re-run as an exact scan: correct results first,
        speed second.
        """
        conditions, condition_params = (where or ChunkFilter()).sql()
        query = sql.SQL(
            "SELECT chunk_id, 1 - (embedding <=> %s) FROM {s}.chunks WHERE zone = %s{c} "
            "ORDER BY embedding <=> %s LIMIT %s"
        ).format(s=self._schema, c=conditions)
        params = [embedding, zone, *condition_params, embedding, limit]
        # One round trip: autocommit, ef_search held by the connection's session, the statement prepared by
        # psycopg after its first few runs.
        with self._reading() as conn:
            use_session_setting(conn, "hnsw.ef_search", str(max(ef_search, limit)))
            rows = conn.execute(query, params).fetchall()
            if len(rows) < limit:
                available = conn.execute(
                    sql.SQL(
                        "SELECT count(*) FROM (SELECT 1 FROM {s}.chunks WHERE zone = %s{c} LIMIT %s) t"
                    ).format(s=self._schema, c=conditions),
                    [zone, *condition_params, limit],
                ).fetchone()
                if available is not None and int(available[0]) > len(rows):
                    with conn.transaction():
                        conn.execute("SELECT set_config('enable_indexscan', 'off', true)")
                        # Not prepared: a plan made without the index must never be kept for later searches.
                        rows = conn.execute(query, params, prepare=False).fetchall()
        return [VectorHit(chunk_id=r[0], score=float(r[1])) for r in rows]

    def matching_chunk_ids(self, *, zone: str, where: ChunkFilter) -> frozenset[str]:
        """Ids of the zone's chunks that pass ``where`` (the keyword leg masks its index with them)."""
        conditions, params = where.sql()
        with self._reading() as conn:
            rows = conn.execute(
                sql.SQL("SELECT chunk_id FROM {s}.chunks WHERE zone = %s{c}").format(s=self._schema, c=conditions),
                [zone, *params],
            ).fetchall()
        return frozenset(r[0] for r in rows)

    def fetch_chunks(self, chunk_ids: Sequence[str], *, zone: str) -> dict[str, ChunkRecord]:
        """Chunks by id, restricted to ``zone``. Ids of chunks that no longer exist (replaced since the
        BM25 generation that returned them was built) are simply absent."""
        if not chunk_ids:
            return {}
        with self._reading() as conn:
            rows = conn.execute(
                sql.SQL("SELECT {cols} FROM {s}.chunks WHERE chunk_id = ANY(%s) AND zone = %s").format(
                    cols=_RECORD_COLUMNS, s=self._schema
                ),
                (list(chunk_ids), zone),
            ).fetchall()
        return {r[0]: ChunkRecord.from_row(r) for r in rows}

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
