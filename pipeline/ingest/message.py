"""One message of write events through the ingest stage: each event's outcome, the documents that go on
to the embed stage, and the shards whose BM25 index must be told about deletes and skips.

The message's events are parsed, grouped by document (the events of one document stay in order, on one
thread, under its lease) and the groups worked on a few at a time: an event mostly waits on Redis (its
lease) and PostgreSQL. Each event's work runs against its deadline (``ingest.document_deadline_s``,
:mod:`shardfuse.pipeline.core.deadline`); a document that overruns fails alone, with
:class:`~shardfuse.pipeline.core.errors.DeadlineExceededError`, and a thread that does not come back is
given up on (:mod:`shardfuse.pipeline.ingest.document_threads`). Nothing here settles a failure: each failed
event is returned with its error, and the caller decides between retry and dead letter.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.lease_holding import Leases, MessageLeases
from shardfuse.pipeline.core.deadline import Deadline, running_within
from shardfuse.pipeline.core.documents import PreparedDocument
from shardfuse.pipeline.core.events import WriteEvent, parse_event
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.index.store import ShardStore
from shardfuse.pipeline.ingest.document_threads import Done, run_groups
from shardfuse.pipeline.ingest.preparation import ChunkRegistry, Contextualizer
from shardfuse.pipeline.ingest.stage import IngestResult, held_seqs, ingest_event
from shardfuse.pipeline.storage.cas import ContentStore

# Documents of one message worked on at once (each on its own thread).
EVENT_THREADS = 4

DocKey = tuple[str, str]
Failure = tuple[Any, BaseException]
# What wraps the work on one event (the worker sets the event's log context there).
AroundEvent = Callable[[WriteEvent], AbstractContextManager[object]]


@dataclass(frozen=True, slots=True)
class IngestPorts:
    """What the ingest stage works with: one worker process's settings, stores and leases."""

    settings: Settings
    cas: ContentStore
    stores: Sequence[ShardStore]
    counter: TokenCounter
    leases: Leases
    contextualizer: Contextualizer | None = None
    registry: ChunkRegistry | None = None


@dataclass(frozen=True, slots=True)
class IngestedMessage:
    """What one message of events came to.

    ``counts``: the events that succeeded, by :class:`IngestResult` value. ``documents``: the chunked
    documents for the embed stage, in message order. ``unchanged``: per shard, the documents deleted or
    skipped there, which need no embedding, and those whose event the shard already held (stale): their
    BM25 update is due now (the embed stage schedules the others' once it commits them). A stale event may
    be the redelivered copy of one whose first run committed and then died before its BM25 bookkeeping,
    so its bookkeeping is repeated: one more delta entry, never a document the keyword leg misses.
    ``failures``: each event that failed (as received) with its error.
    """

    counts: Mapping[str, int] = field(default_factory=dict)
    documents: tuple[PreparedDocument, ...] = ()
    unchanged: Mapping[int, tuple[DocKey, ...]] = field(default_factory=dict)
    failures: tuple[Failure, ...] = ()


def ingest_message(
    raw_events: Sequence[Any],
    *,
    ports: IngestPorts,
    refresh: bool = False,
    around: AroundEvent | None = None,
    threads: int = EVENT_THREADS,
) -> IngestedMessage:
    """Ingest the events of one message (:func:`~shardfuse.pipeline.ingest.stage.ingest_event` each, under
    its document's lease: the message's leases are taken in one round trip and given back in one,
    :class:`~shardfuse.pipeline.coordination.lease_holding.MessageLeases`). ``refresh`` re-indexes the seq a
    shard holds (``shardfuse backfill-context``).

    The early version check of the whole message is one query per shard touched; if it fails, each event
    asks its shard itself.
    """
    failures: list[Failure] = []
    groups: dict[DocKey, list[tuple[Any, WriteEvent]]] = {}
    for raw in raw_events:
        try:
            event = parse_event(raw)
        except Exception as exc:  # noqa: BLE001 - a malformed event fails alone
            failures.append((raw, exc))
            continue
        groups.setdefault(event.key, []).append((raw, event))
    held = _held_seqs([e for group in groups.values() for _, e in group], ports)
    try:
        leases = MessageLeases(ports.leases, list(groups))
    except Exception as exc:  # noqa: BLE001 - Redis out of reach: every event fails with it; the caller retries
        return _collate([(raw, event, exc) for group in groups.values() for raw, event in group], failures)

    def one_document(group: list[tuple[Any, WriteEvent]]) -> list[Done]:
        try:
            return [_ingest_one(raw, event, ports=ports, refresh=refresh, held=held, leases=leases, around=around)
                    for raw, event in group]
        finally:
            leases.finish(group[0][1].key)

    try:
        done = run_groups(list(groups.values()), one_document, threads=threads,
                          deadline_s=ports.settings.ingest.document_deadline_s)
    finally:
        leases.close()
    return _collate(done, failures)


def _held_seqs(events: Sequence[WriteEvent], ports: IngestPorts) -> dict[DocKey, int] | None:
    try:
        return held_seqs(events, stores=ports.stores, shards=ports.settings.shards)
    except Exception:  # noqa: BLE001 - only an optimisation: each event then asks its shard itself
        return None


def _ingest_one(raw: Any, event: WriteEvent, *, ports: IngestPorts, refresh: bool,
                held: Mapping[DocKey, int] | None, leases: MessageLeases, around: AroundEvent | None) -> Done:
    try:
        deadline = Deadline(ports.settings.ingest.document_deadline_s, what=f"[{event.zone}] {event.path}")
        with (contextlib.nullcontext() if around is None else around(event)), \
                leases.held(event.zone, event.path) as lease, running_within(deadline):
            return raw, event, ingest_event(
                event, settings=ports.settings, cas=ports.cas, stores=ports.stores, counter=ports.counter,
                contextualizer=ports.contextualizer, registry=ports.registry, refresh=refresh,
                fence=lease.token, held_seqs=held)
    except Exception as exc:  # noqa: BLE001 - a failed event fails alone; the caller settles it
        return raw, event, exc


def _collate(results: list[Done], failures: list[Failure]) -> IngestedMessage:
    counts: Counter[str] = Counter()
    documents: list[PreparedDocument] = []
    unchanged: dict[int, list[DocKey]] = {}
    for raw, event, outcome in results:
        if isinstance(outcome, BaseException):
            failures.append((raw, outcome))
            continue
        counts[outcome.result.value] += 1
        if outcome.document is not None:
            documents.append(outcome.document)
        elif outcome.result in (IngestResult.DELETED, IngestResult.SKIPPED, IngestResult.STALE):
            unchanged.setdefault(outcome.shard, []).append(event.key)
    return IngestedMessage(counts=dict(counts), documents=tuple(documents),
                           unchanged={shard: tuple(keys) for shard, keys in unchanged.items()},
                           failures=tuple(failures))
