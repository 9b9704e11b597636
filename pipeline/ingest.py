"""The ingest stage: one write event in, a chunked document (or a recorded skip/tombstone) out."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.cas import ContentStore
from pipeline.decode import Skipped, decode_content
from pipeline.events import Op, WriteEvent
from pipeline.models import PreparedDocument
from pipeline.preparation import ChunkRegistry, Contextualizer, prepare_chunks
from pipeline.settings import Settings
from pipeline.sharding import shard_for
from pipeline.store import DocStatus, DocumentChange, ShardStore
from pipeline.tokens import TokenCounter


class IngestResult(enum.StrEnum):
    PREPARED = "prepared"  # chunked; goes on to the embed stage
    STALE = "stale"  # the shard already holds this seq or a newer one
    SKIPPED = "skipped"  # binary, undecodable, empty or too large: recorded on the document row
    DELETED = "deleted"  # tombstone written


@dataclass(frozen=True, slots=True)
class IngestOutcome:
    result: IngestResult
    shard: int
    document: PreparedDocument | None = None
    reason: str | None = None


def ingest_event(
    event: WriteEvent,
    *,
    settings: Settings,
    cas: ContentStore,
    stores: Sequence[ShardStore],
    counter: TokenCounter,
    contextualizer: Contextualizer | None = None,
    registry: ChunkRegistry | None = None,
    refresh: bool = False,
) -> IngestOutcome:
    """Version check → read from the CAS → decode → chunk → filter → contextualize
    (:func:`pipeline.preparation.prepare_chunks`).

    Deletes and skips are applied to the shard here (they need no embedding); a prepared document is
    returned for the embed stage, which applies it. The early version check only saves work: the
    authoritative check runs again inside the shard's write transaction. ``refresh`` re-indexes the seq
    the shard holds (``shardfuse backfill-context``) instead of treating it as stale.
    """
    shard = shard_for(event.zone, event.path, settings.shards)
    store = stores[shard]
    held = store.document_seq(event.zone, event.path)
    if held is not None and (held > event.seq or (held == event.seq and not refresh)):
        return IngestOutcome(IngestResult.STALE, shard, reason=f"shard holds seq {held} >= {event.seq}")

    if event.op is Op.DELETE:
        return _applied(store, DocumentChange(event=event, status=DocStatus.DELETED), IngestResult.DELETED)

    assert event.content_hash is not None  # guaranteed by WriteEvent validation
    decoded = decode_content(cas.get(event.content_hash), max_bytes=settings.limits.max_file_bytes)
    if isinstance(decoded, Skipped):
        change = DocumentChange(event=event, status=DocStatus.SKIPPED, reason=decoded.reason)
        return _applied(store, change, IngestResult.SKIPPED, reason=decoded.reason)

    prepared = prepare_chunks(decoded.text, path=event.path, doc_hash=event.content_hash, settings=settings,
                              counter=counter, contextualizer=contextualizer, registry=registry, zone=event.zone)
    if not prepared.chunks:
        reason = "no text to index (whitespace only)"
        change = DocumentChange(event=event, status=DocStatus.SKIPPED, reason=reason)
        return _applied(store, change, IngestResult.SKIPPED, reason=reason)
    document = PreparedDocument(event=event, shard=shard, chunks=prepared.chunks, line_count=decoded.line_count,
                                dropped=prepared.dropped, refresh=refresh)
    return IngestOutcome(IngestResult.PREPARED, shard, document=document)


def _applied(
    store: ShardStore, change: DocumentChange, result: IngestResult, *, reason: str | None = None
) -> IngestOutcome:
    (outcome,) = store.apply([change])
    if not outcome.applied:
        return IngestOutcome(IngestResult.STALE, store.shard, reason=f"shard holds seq {outcome.stored_seq}")
    return IngestOutcome(result, store.shard, reason=reason)
