"""The ingest stage: one write event in, a chunked document (or a recorded skip/tombstone) out."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.deadline import call_within, checkpoint
from shardfuse.pipeline.core.documents import PreparedDocument
from shardfuse.pipeline.core.errors import LeaseLostError, UnprocessableContentError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.grep_blocks import cut_blocks
from shardfuse.pipeline.ingest.decode import Decoded, Skipped, decode_content, too_large
from shardfuse.pipeline.ingest.preparation import ChunkRegistry, Contextualizer, PreparedChunks, prepare_chunks
from shardfuse.pipeline.storage.cas import ContentStore


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
    fence: int | None = None,
    held_seqs: Mapping[tuple[str, str], int] | None = None,
) -> IngestOutcome:
    """Version check → read from the CAS → decode → chunk → filter → contextualize
    (:func:`shardfuse.pipeline.ingest.preparation.prepare_chunks`).

    Deletes and skips are applied to the shard here (they need no embedding); a prepared document is
    returned for the embed stage, which applies it. The early version check only saves work: the
    authoritative check runs again inside the shard's write transaction. ``refresh`` re-indexes the seq
    the shard holds (``shardfuse backfill-context``) instead of treating it as stale. ``fence`` is the
    token of the caller's document lease (:mod:`shardfuse.pipeline.coordination.leases`), carried by the writes made
    here.
    ``held_seqs``, when given, is what :func:`held_seqs` read for the caller's batch of events: the early
    check then costs no query (read before the lease was taken, it may be older than the shard, which
    only means the write transaction refuses what the early check let through).

    The work runs against the caller's current deadline, if any (:mod:`shardfuse.pipeline.core.deadline`):
    the CAS read is waited for no longer than it leaves, and each stage, and the long loops inside the
    chunkers and the filter, check it; past it the event fails with
    :class:`~shardfuse.pipeline.core.errors.DeadlineExceededError`. A skip or tombstone whose work is done
    is still written.
    """
    shard = shard_for(event.zone, event.path, settings.shards)
    store = stores[shard]
    held = store.document_seq(event.zone, event.path) if held_seqs is None else held_seqs.get(event.key)
    if held is not None and (held > event.seq or (held == event.seq and not refresh)):
        return IngestOutcome(IngestResult.STALE, shard, reason=f"shard holds seq {held} >= {event.seq}")

    if event.op is Op.DELETE:
        return _applied(store, DocumentChange(event=event, status=DocStatus.DELETED, fence=fence),
                        IngestResult.DELETED)

    assert event.content_hash is not None  # guaranteed by WriteEvent validation
    decoded = _read(cas, event.content_hash, max_bytes=settings.limits.max_file_bytes)
    if isinstance(decoded, Skipped):
        change = DocumentChange(event=event, status=DocStatus.SKIPPED, reason=decoded.reason, fence=fence)
        return _applied(store, change, IngestResult.SKIPPED, reason=decoded.reason)

    checkpoint("decoding its content")
    # Whitespace alone has nothing to index, and a long enough run of it crashes the tokenizer.
    prepared = None if decoded.text.isspace() else _prepare(
        decoded.text, event, settings=settings, counter=counter, contextualizer=contextualizer, registry=registry)
    if prepared is None or not prepared.chunks:
        reason = "no text to index (whitespace only)"
        change = DocumentChange(event=event, status=DocStatus.SKIPPED, reason=reason, fence=fence)
        return _applied(store, change, IngestResult.SKIPPED, reason=reason)
    document = PreparedDocument(event=event, shard=shard, chunks=prepared.chunks, line_count=decoded.line_count,
                                dropped=prepared.dropped, refresh=refresh, blocks=cut_blocks(decoded.text))
    return IngestOutcome(IngestResult.PREPARED, shard, document=document)


def held_seqs(events: Sequence[WriteEvent], *, stores: Sequence[ShardStore], shards: int
              ) -> dict[tuple[str, str], int]:
    """The seq every shard holds for the documents of ``events``, one query per shard touched (the early
    version check of a batch of events, for :func:`ingest_event`)."""
    by_shard: dict[int, set[tuple[str, str]]] = {}
    for event in events:
        by_shard.setdefault(shard_for(event.zone, event.path, shards), set()).add(event.key)
    held: dict[tuple[str, str], int] = {}
    for shard, keys in sorted(by_shard.items()):
        held.update(stores[shard].document_seqs(sorted(keys)))
    return held


def _read(cas: ContentStore, content_hash: str, *, max_bytes: int) -> Decoded | Skipped:
    """The content decoded, or why not; content over the size limit is skipped without being read."""
    found = call_within(lambda: cas.get_within(content_hash, max_bytes), "reading its content from the CAS")
    if found.data is None:
        return too_large(found.size, max_bytes=max_bytes)
    return decode_content(found.data, max_bytes=max_bytes)


def _prepare(
    text: str,
    event: WriteEvent,
    *,
    settings: Settings,
    counter: TokenCounter,
    contextualizer: Contextualizer | None,
    registry: ChunkRegistry | None,
) -> PreparedChunks:
    """:func:`prepare_chunks`, with a crash of a native extension turned into an error about this content.

    tiktoken's Rust core panics (``pyo3_runtime.PanicException``, a ``BaseException`` that no ``except
    Exception`` catches) on very long runs of whitespace: a million tabs, a few hundred thousand spaces. Let
    through, it would fail the whole message, its other events with it, and record nothing.
    """
    assert event.content_hash is not None
    try:
        return prepare_chunks(text, path=event.path, doc_hash=event.content_hash, settings=settings,
                              counter=counter, contextualizer=contextualizer, registry=registry, zone=event.zone)
    except BaseException as exc:
        if isinstance(exc, Exception | KeyboardInterrupt | SystemExit | GeneratorExit):
            raise
        raise UnprocessableContentError(_crash_reason(text, exc)) from exc


def _crash_reason(text: str, exc: BaseException) -> str:
    longest = max(re.finditer(r"\s{1000,}", text), key=lambda m: m.end() - m.start(), default=None)
    where = ("" if longest is None else
             f"; its longest run of whitespace is {longest.end() - longest.start():,} characters, "
             f"at character {longest.start():,}")
    return (f"the tokenizer crashed on this content ({type(exc).__name__}: {exc}){where}. tiktoken cannot split "
            "very long runs of whitespace (hundreds of thousands of spaces or tabs in a row, openai/tiktoken#15): "
            "shorten them and publish the file again")


def _applied(
    store: ShardStore, change: DocumentChange, result: IngestResult, *, reason: str | None = None
) -> IngestOutcome:
    (outcome,) = store.apply([change])
    if outcome.fenced:
        raise LeaseLostError.fenced(stored_fence=outcome.stored_fence, carried=change.fence)
    if not outcome.applied:
        return IngestOutcome(IngestResult.STALE, store.shard, reason=f"shard holds seq {outcome.stored_seq}")
    return IngestOutcome(result, store.shard, reason=reason)
