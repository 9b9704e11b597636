"""One message of write events through the ingest stage: each event's outcome, the documents that go on
to the embed stage, and the shards whose BM25 index must be told about deletes and skips.

The message's events are parsed, grouped by document (the events of one document stay in order, on one
thread, under its lease) and the groups worked on a few at a time: an event mostly waits on Redis (its
lease) and PostgreSQL. Nothing here settles a failure: each failed event is returned with its error, and
the caller decides between retry and dead letter.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.lease_holding import Leases, leased
from shardfuse.pipeline.core.documents import PreparedDocument
from shardfuse.pipeline.core.events import WriteEvent, parse_event
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.index.store import ShardStore
from shardfuse.pipeline.ingest.preparation import ChunkRegistry, Contextualizer
from shardfuse.pipeline.ingest.stage import IngestOutcome, IngestResult, held_seqs, ingest_event
from shardfuse.pipeline.storage.cas import ContentStore

# Documents of one message worked on at once (each on its own thread).
EVENT_THREADS = 4

DocKey = tuple[str, str]
Failure = tuple[Any, BaseException]
# What wraps the work on one event (the worker sets the event's log context there).
AroundEvent = Callable[[WriteEvent], AbstractContextManager[object]]
_Done = tuple[Any, WriteEvent, IngestOutcome | BaseException]


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
    skipped there, which need no embedding: their BM25 update is due now (the embed stage schedules the
    others' once it commits them). ``failures``: each event that failed (as received) with its error.
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
    its document's lease). ``refresh`` re-indexes the seq a shard holds (``shardfuse backfill-context``).

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

    def one_document(group: list[tuple[Any, WriteEvent]]) -> list[_Done]:
        return [_ingest_one(raw, event, ports=ports, refresh=refresh, held=held, around=around)
                for raw, event in group]

    return _collate(_run_groups(list(groups.values()), one_document, threads), failures)


def _held_seqs(events: Sequence[WriteEvent], ports: IngestPorts) -> dict[DocKey, int] | None:
    try:
        return held_seqs(events, stores=ports.stores, shards=ports.settings.shards)
    except Exception:  # noqa: BLE001 - only an optimisation: each event then asks its shard itself
        return None


def _ingest_one(raw: Any, event: WriteEvent, *, ports: IngestPorts, refresh: bool,
                held: Mapping[DocKey, int] | None, around: AroundEvent | None) -> _Done:
    try:
        with (contextlib.nullcontext() if around is None else around(event)), \
                leased(ports.leases, event.zone, event.path) as lease:
            return raw, event, ingest_event(
                event, settings=ports.settings, cas=ports.cas, stores=ports.stores, counter=ports.counter,
                contextualizer=ports.contextualizer, registry=ports.registry, refresh=refresh,
                fence=lease.token, held_seqs=held)
    except Exception as exc:  # noqa: BLE001 - a failed event fails alone; the caller settles it
        return raw, event, exc


def _run_groups(groups: list[list[tuple[Any, WriteEvent]]], one: Callable[[list[tuple[Any, WriteEvent]]],
                list[_Done]], threads: int) -> list[_Done]:
    """``one`` over every group, a few groups at a time, results in group order."""
    if len(groups) <= 1 or threads <= 1:
        return [done for group in groups for done in one(group)]
    with ThreadPoolExecutor(max_workers=min(threads, len(groups)), thread_name_prefix="ingest-event") as pool:
        # Each thread runs in a copy of the caller's context: its log context (task, task id) carries over.
        futures = [pool.submit(contextvars.copy_context().run, one, group) for group in groups]
        return [done for future in futures for done in future.result()]


def _collate(results: list[_Done], failures: list[Failure]) -> IngestedMessage:
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
        elif outcome.result in (IngestResult.DELETED, IngestResult.SKIPPED):
            unchanged.setdefault(outcome.shard, []).append(event.key)
    return IngestedMessage(counts=dict(counts), documents=tuple(documents),
                           unchanged={shard: tuple(keys) for shard, keys in unchanged.items()},
                           failures=tuple(failures))
