"""The shard writer: commits embedded documents to their shards on a thread of its own.

The embed batcher (:mod:`shardfuse.pipeline.embed.batcher`) hands over one flush at a time as a
:class:`WriteBatch`: its documents' changes by shard, each with the future its caller waits on. The writer
commits each shard's documents in one transaction (after asking the bulk-load gate whether the write should
skip the shard's HNSW index) and settles every future with the document's own outcome. At most one batch
waits for the writer (:meth:`ShardWriter.put` blocks until the writer takes the previous one), so a slow
database slows the embedding down instead of piling up vectors. Batches are written in the order they come;
the version rule and fencing tokens in the shard's transaction decide what applies whatever the order.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from shardfuse.pipeline.core.errors import EmbeddingModelsChangedError
from shardfuse.pipeline.index.store import ApplyOutcome, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.bulk_load import BulkLoadGate

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """One document's change, and the future its caller waits on for the outcome."""

    change: DocumentChange
    future: Future[ApplyOutcome]


def _ignore_write_ms(_write_ms: float) -> None:
    pass


@dataclass(frozen=True, slots=True)
class WriteBatch:
    """One flush's changes by shard. ``written`` hears how long writing them took (ms), once all are settled."""

    by_shard: dict[int, list[PendingWrite]]
    written: Callable[[float], None] = _ignore_write_ms


def _ignore_shard(_shard: int) -> None:
    pass


class ShardWriter:
    """Writes batches of document changes, one transaction per shard, on its own thread.

    ``models_changed(shard)`` is called when the shard refused a document because its zone is now also written
    with another embedding model: the caller's copy of the shard's model lists is stale.
    """

    def __init__(
        self,
        *,
        stores: Sequence[ShardStore],
        gate: BulkLoadGate | None = None,
        models_changed: Callable[[int], None] = _ignore_shard,
    ) -> None:
        self._stores = stores
        self._gate = gate
        self._models_changed = models_changed
        self._batches: queue.Queue[WriteBatch | None] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name="embed-writer", daemon=True)
        self._thread.start()

    def put(self, batch: WriteBatch) -> None:
        """Queue ``batch`` for writing; blocks while an earlier batch still waits for the writer."""
        self._batches.put(batch)

    def close(self, timeout: float = 5) -> None:
        """Write what was queued, then stop the thread (waiting at most about ``2 × timeout`` seconds)."""
        with contextlib.suppress(queue.Full):  # the writer is stuck: it is a daemon thread
            self._batches.put(None, timeout=timeout)
        self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while (batch := self._batches.get()) is not None:
            try:
                self._write(batch)
            except Exception as exc:  # noqa: BLE001 - a bug here must not leave a waiter hanging
                log.exception("writing an embedded batch failed")
                for items in batch.by_shard.values():
                    for item in items:
                        if not item.future.done():
                            item.future.set_exception(exc)

    def _write(self, batch: WriteBatch) -> None:
        started = time.perf_counter()
        for shard, items in batch.by_shard.items():
            self._write_shard(shard, items)
        batch.written((time.perf_counter() - started) * 1000)

    def _write_shard(self, shard: int, items: list[PendingWrite]) -> None:
        self._before_write(shard, [item.change for item in items])
        try:
            outcomes = {o.key: o for o in self._stores[shard].apply([item.change for item in items])}
        except Exception as exc:  # this shard's documents fail; the other shards' commits stand
            for item in items:
                item.future.set_exception(exc)
            return
        for item in items:
            change, outcome = item.change, outcomes[item.change.key]
            if outcome.missing_models and outcome.seq == change.event.seq:
                self._models_changed(shard)  # read the zone's models again before the retry is embedded
                item.future.set_exception(EmbeddingModelsChangedError(
                    f"zone {change.event.zone!r} is now also written with {', '.join(outcome.missing_models)}: "
                    "embedding the document again"))
                continue
            # Two versions of one document in a batch: only the newest is applied.
            applied = outcome.applied and outcome.seq == change.event.seq
            item.future.set_result(
                ApplyOutcome(key=change.key, seq=change.event.seq, applied=applied,
                             stored_seq=outcome.stored_seq, fenced=outcome.fenced,
                             stored_fence=outcome.stored_fence)
            )

    def _before_write(self, shard: int, changes: list[DocumentChange]) -> None:
        if self._gate is None:
            return
        try:
            self._gate.before_write(shard, rows=sum(len(c.chunks) for c in changes), documents=len(changes))
        except Exception:  # noqa: BLE001 - the write goes ahead with the index as it is
            log.warning("could not decide on bulk-load mode for shard %d", shard, exc_info=True)
