"""Read-only views of a shard for ``shardfuse status`` and ``backfill-context``: what the entropy filter
dropped, and which documents still wait for LLM contexts."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from psycopg import sql

from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.store.connections import pooled_connection
from shardfuse.pipeline.index.store.schema import shard_schema
from shardfuse.pipeline.index.store.shard_store import ShardStore


def chunk_quality(store: ShardStore) -> dict[str, dict[str, Any]]:
    """Per zone: chunks dropped by the entropy filter by reason, and documents (and chunks) whose chunks
    wait for an LLM context."""
    schema = sql.Identifier(shard_schema(store.shard))
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"dropped": {}, "backfill_documents": 0,
                                                          "backfill_chunks": 0})
    with pooled_connection(store.pool, what=f"shard {store.shard}") as conn:
        dropped = conn.execute(
            sql.SQL(
                "SELECT d.zone, r.key, sum(r.value::int) FROM {s}.documents d, jsonb_each_text(d.dropped) r "
                "WHERE d.status = 'indexed' GROUP BY d.zone, r.key ORDER BY d.zone, r.key"
            ).format(s=schema)
        ).fetchall()
        pending = conn.execute(
            sql.SQL(
                "SELECT zone, count(DISTINCT path), count(*) FROM {s}.chunks WHERE context_source = 'backfill' "
                "GROUP BY zone ORDER BY zone"
            ).format(s=schema)
        ).fetchall()
    for zone, reason, count in dropped:
        out[zone]["dropped"][reason] = int(count)
    for zone, documents, chunks in pending:
        out[zone]["backfill_documents"], out[zone]["backfill_chunks"] = int(documents), int(chunks)
    return dict(out)


def backfill_events(store: ShardStore, zone: str) -> list[WriteEvent]:
    """The write events (as stored: same seq, content hash and metadata) of the zone's indexed documents
    that have chunks waiting for an LLM context."""
    schema = sql.Identifier(shard_schema(store.shard))
    query = sql.SQL(
        "SELECT d.path, d.seq, d.content_hash, d.event_id, d.size, d.mime, d.metadata FROM {s}.documents d "
        "WHERE d.zone = %s AND d.status = 'indexed' AND EXISTS (SELECT 1 FROM {s}.chunks c WHERE c.zone = d.zone "
        "AND c.path = d.path AND c.context_source = 'backfill') ORDER BY d.path"
    ).format(s=schema)
    with pooled_connection(store.pool, what=f"shard {store.shard}") as conn:
        rows = conn.execute(query, (zone,)).fetchall()
    return [
        WriteEvent(
            op=Op.WRITE,
            zone=zone,
            path=path,
            seq=seq,
            content_hash=content_hash,
            size=size or 0,
            mime=mime,
            metadata=metadata,
            **({"event_id": event_id} if event_id else {}),
        )
        for path, seq, content_hash, event_id, size, mime, metadata in rows
    ]
