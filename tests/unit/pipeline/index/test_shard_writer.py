"""The shard writer: one transaction per shard, each caller settled with its own document's outcome."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, cast

import numpy as np
import pytest

from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.errors import EmbeddingModelsChangedError, StoreUnavailableError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.shard_writer import PendingWrite, ShardWriter, WriteBatch
from shardfuse.pipeline.index.store import ApplyOutcome, DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.bulk_load import BulkLoadGate


class FakeStore:
    """A shard's write side: records its transactions; ``missing`` models are refused as ShardStore.apply does
    for a zone that is now also written with another model."""

    def __init__(self, *, fail: bool = False, missing: tuple[str, ...] = (), hold: threading.Event | None = None):
        self.transactions: list[list[DocumentChange]] = []
        self.fail, self.missing, self.hold = fail, missing, hold
        self.entered = threading.Event()

    def apply(self, changes: Sequence[DocumentChange]) -> list[ApplyOutcome]:
        self.entered.set()
        if self.hold is not None:
            self.hold.wait(10)
        if self.fail:
            raise StoreUnavailableError("shard is down")
        self.transactions.append(list(changes))
        newest: dict[tuple[str, str], DocumentChange] = {}
        for c in changes:
            if c.key not in newest or c.event.seq > newest[c.key].event.seq:
                newest[c.key] = c
        return [ApplyOutcome(k, c.event.seq, not self.missing, None, missing_models=self.missing)
                for k, c in newest.items()]


class RecordingGate:
    def __init__(self, *, fail: bool = False) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.fail = fail

    def before_write(self, shard: int, *, rows: int, documents: int) -> None:
        self.calls.append((shard, rows, documents))
        if self.fail:
            raise RuntimeError("the catalog is unreachable")


def _write(path: str, *, chunks: int = 1, seq: int = 1) -> PendingWrite:
    event = WriteEvent(op=Op.WRITE, zone="z", path=path, content_hash="sha256:" + "0" * 64, seq=seq)
    change = DocumentChange(event=event, status=DocStatus.INDEXED,
                            chunks=tuple(Chunk(i, f"{path} {i}", 0, 1, 1, 1, 2) for i in range(chunks)),
                            embeddings=np.zeros((chunks, 4), dtype=np.float32))
    return PendingWrite(change, Future())


def _writer(stores: list[FakeStore], **kwargs: Any) -> ShardWriter:
    return ShardWriter(stores=cast(Sequence[ShardStore], stores), **kwargs)


def test_each_shard_gets_one_transaction_and_a_failing_shard_fails_only_its_documents() -> None:
    stores = [FakeStore(), FakeStore(fail=True)]
    gate = RecordingGate()
    written: list[float] = []
    writer = _writer(stores, gate=cast(BulkLoadGate, gate))
    a, b, c = _write("a", chunks=2), _write("b", chunks=3), _write("c")
    try:
        writer.put(WriteBatch({0: [a, b], 1: [c]}, written=written.append))
        assert a.future.result(5).applied and b.future.result(5).applied
        with pytest.raises(StoreUnavailableError):
            c.future.result(5)
    finally:
        writer.close()
    assert [[ch.key for ch in t] for t in stores[0].transactions] == [[("z", "a"), ("z", "b")]]
    assert gate.calls == [(0, 5, 2), (1, 1, 1)]  # asked before each shard's write, with its rows and documents
    assert len(written) == 1 and written[0] >= 0


def test_a_failing_bulk_load_gate_does_not_stop_the_write() -> None:
    store = FakeStore()
    writer = _writer([store], gate=cast(BulkLoadGate, RecordingGate(fail=True)))
    item = _write("a")
    try:
        writer.put(WriteBatch({0: [item]}))
        assert item.future.result(5).applied
    finally:
        writer.close()
    assert len(store.transactions) == 1


def test_only_the_newest_of_two_versions_in_a_batch_counts_as_applied() -> None:
    writer = _writer([FakeStore()])
    old, new = _write("same", seq=1), _write("same", seq=2)
    try:
        writer.put(WriteBatch({0: [old, new]}))
        assert (old.future.result(5).applied, new.future.result(5).applied) == (False, True)
        assert old.future.result(5).seq == 1 and new.future.result(5).seq == 2
    finally:
        writer.close()


def test_a_write_refused_for_a_new_model_is_a_transient_error_and_the_caller_hears_which_shard() -> None:
    changed: list[int] = []
    writer = _writer([FakeStore(), FakeStore(missing=("mini",))], models_changed=changed.append)
    item = _write("a")
    try:
        writer.put(WriteBatch({1: [item]}))
        with pytest.raises(EmbeddingModelsChangedError, match="mini"):
            item.future.result(5)
    finally:
        writer.close()
    assert changed == [1]


def test_at_most_one_batch_waits_for_a_slow_shard() -> None:
    """Backpressure: with one batch being written and one waiting, handing over a third blocks."""
    release = threading.Event()
    store = FakeStore(hold=release)
    writer = _writer([store])
    first, second, third = _write("a"), _write("b"), _write("c")
    try:
        writer.put(WriteBatch({0: [first]}))
        assert store.entered.wait(5)  # the writer is inside the first batch's transaction
        writer.put(WriteBatch({0: [second]}))
        handing = threading.Thread(target=writer.put, args=(WriteBatch({0: [third]}),))
        handing.start()
        handing.join(0.3)
        assert handing.is_alive()
        release.set()
        handing.join(5)
        assert not handing.is_alive()
        assert third.future.result(5).applied
    finally:
        release.set()
        writer.close()
