"""The write transaction of one shard: the version and fencing rules, the embedding models a zone's writes
must carry, and the replacement of a document's chunks (binary COPY of the rows of
:mod:`shardfuse.pipeline.index.store.rows`).

:class:`~shardfuse.pipeline.index.store.shard_store.ShardStore` lends the connection; everything here runs in
one transaction, so a reader sees a document's old chunks or its new ones, never a mix and never none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from shardfuse.pipeline.config.settings import DEFAULT_MODEL
from shardfuse.pipeline.index.store import embedding_columns, vector_types
from shardfuse.pipeline.index.store.change_log import CHANGE_XID
from shardfuse.pipeline.index.store.changes import ApplyOutcome, DocStatus, DocumentChange
from shardfuse.pipeline.index.store.grep_store import copy_blocks, delete_blocks
from shardfuse.pipeline.index.store.rows import CHUNK_COLUMNS, chunk_rows, chunk_types

# The pgvector type of the shard's embeddings, read on the connection of the write when first needed.
VectorTypeOf = Callable[[psycopg.Connection[Any]], vector_types.VectorType]


def apply_changes(conn: psycopg.Connection[Any], schema: sql.Identifier, shard: int,
                  changes: Sequence[DocumentChange], *, vector_type_of: VectorTypeOf) -> list[ApplyOutcome]:
    """Apply document changes to the shard ``shard`` (schema ``schema``) in one transaction on ``conn``; a
    change older than what the shard holds is a no-op. See :meth:`ShardStore.apply
    <shardfuse.pipeline.index.store.shard_store.ShardStore.apply>`.

    Rows are locked in ``(zone, path)`` order so that concurrent batches touching the same documents queue
    behind each other instead of deadlocking.
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
    with conn.transaction(), conn.cursor() as cur:
        # Which embedding columns each zone's writes fill; the list cannot change before this commits.
        embedding_columns.lock_shared(cur, shard)
        required = embedding_columns.required_models(cur, schema, zones)
        # A placeholder row (seq -1) gives a never-seen document something to lock; it is replaced
        # below in the same transaction, so no reader ever sees it.
        cur.execute(
            _q(
                schema,
                "INSERT INTO {s}.documents (zone, path, seq, status) "
                "SELECT z, p, -1, 'pending' FROM unnest(%s::text[], %s::text[]) AS t(z, p) "
                "ORDER BY z, p ON CONFLICT (zone, path) DO NOTHING"
            ),
            (zones, paths),
        )
        cur.execute(
            _q(
                schema,
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
            _replace(cur, schema, fresh, required, vector_type_of)
        # A stale change's token still counts: the shard remembers the newest lease that reached it.
        fresh_keys = {c.key for c in fresh}
        _raise_fences(cur, schema, [latest[k] for k in keys if k not in fenced and k not in fresh_keys
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


def _raise_fences(cur: psycopg.Cursor[Any], schema: sql.Identifier, changes: list[DocumentChange]) -> None:
    if changes:
        cur.executemany(
            _q(schema, "UPDATE {s}.documents SET fence = %s WHERE zone = %s AND path = %s AND fence < %s"),
            [(c.fence, c.event.zone, c.event.path, c.fence) for c in changes],
        )


def _replace(cur: psycopg.Cursor[Any], schema: sql.Identifier, fresh: list[DocumentChange],
             required: dict[str, tuple[str, ...]], vector_type_of: VectorTypeOf) -> None:
    """Replace the chunks of the ``fresh`` changes' documents (binary COPY) and update their rows."""
    cur.execute(
        _q(
            schema,
            "DELETE FROM {s}.chunks c USING unnest(%s::text[], %s::text[]) AS t(z, p) "
            "WHERE c.zone = t.z AND c.path = t.p"
        ),
        ([c.event.zone for c in fresh], [c.event.path for c in fresh]),
    )
    # The grep index's blocks go with the chunks: replaced, or dropped by a tombstone or a skip.
    delete_blocks(cur, schema, [c.key for c in fresh])
    writes = [c for c in fresh if c.status is DocStatus.INDEXED and c.chunks]
    copy_blocks(cur, schema, writes)
    if writes:
        # Other models' columns, for the zones whose writes fill them (most writes: none).
        others = sorted({m for c in writes for m in required[c.event.zone] if m != DEFAULT_MODEL})
        columns = [*CHUNK_COLUMNS, *map(embedding_columns.column_for, others)]
        copy_sql = sql.SQL("COPY {s}.chunks ({cols}) FROM STDIN WITH (FORMAT BINARY)").format(
            s=schema, cols=sql.SQL(", ").join(map(sql.Identifier, columns))
        )
        vector_type = vector_type_of(cur.connection)
        vector = vector_types.copy_value(vector_type)
        with cur.copy(copy_sql) as copy:
            copy.set_types([*chunk_types(vector_type), *(vector_type for _ in others)])
            for change in writes:
                for row in chunk_rows(change, others, vector=vector):
                    copy.write_row(row)
    cur.executemany(
        _q(
            schema,
            "UPDATE {s}.documents SET seq = %s, status = %s, content_hash = %s, event_id = %s, "
            "size = %s, mime = %s, reason = %s, chunk_count = %s, token_count = %s, line_count = %s, "
            "metadata = %s, dropped = %s, fence = greatest(fence, %s), updated_at = now(), "
            # What the BM25 update finds the document by (change_log.py): in the same transaction, so no
            # commit can be in PostgreSQL without it.
            f"change_xid = {CHANGE_XID} "
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


def _q(schema: sql.Identifier, text: str) -> sql.Composed:
    return sql.SQL(text).format(s=schema)
