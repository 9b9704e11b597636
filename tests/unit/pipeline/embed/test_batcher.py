"""Cross-document batching: concurrent submissions share embedding requests and shard transactions."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from shardfuse.pipeline.core.documents import Chunk, PreparedDocument
from shardfuse.pipeline.core.errors import EmbeddingModelsChangedError, EmbeddingProviderError, StoreUnavailableError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.embed.batcher import EmbedBatcher
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.embed.stage import EmbeddingStage
from shardfuse.pipeline.index.store import ApplyOutcome, DocumentChange


class RecordingEmbedder(HashingEmbedder):
    def __init__(self, *, fail: bool = False) -> None:
        super().__init__(8)
        self.requests: list[int] = []
        self.fail = fail

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail:
            raise RuntimeError("provider exploded")
        self.requests.append(len(texts))
        return super().embed_documents(texts)


class FakeStore:
    """A shard's write side: records transactions; ``models`` is its per-zone list of embedding models
    (``fill_models``), and ``apply`` refuses changes lacking one of them, as ShardStore.apply does."""

    def __init__(self, shard: int, *, fail: bool = False, models: dict[str, tuple[str, ...]] | None = None) -> None:
        self.shard = shard
        self.transactions: list[list[DocumentChange]] = []
        self.fail = fail
        self.models = dict(models or {})
        self.model_reads = 0

    def fill_models(self) -> dict[str, tuple[str, ...]]:
        self.model_reads += 1
        return dict(self.models)

    def apply(self, changes: Sequence[DocumentChange]) -> list[ApplyOutcome]:
        if self.fail:
            raise StoreUnavailableError(f"shard {self.shard} is down")
        self.transactions.append(list(changes))
        # ShardStore.apply's contract: one outcome per distinct document, for its newest change.
        newest: dict[tuple[str, str], DocumentChange] = {}
        for c in changes:
            if c.key not in newest or c.event.seq > newest[c.key].event.seq:
                newest[c.key] = c
        outcomes = []
        for key, c in newest.items():
            missing = tuple(m for m in self.models.get(c.event.zone, ("default",)) if m not in c.models)
            outcomes.append(ApplyOutcome(key, c.event.seq, not missing, None, missing_models=missing))
        return outcomes


def _doc(path: str, shard: int, n_chunks: int, seq: int = 1) -> PreparedDocument:
    event = WriteEvent(op=Op.WRITE, zone="z", path=path, content_hash="sha256:" + "0" * 64, seq=seq)
    chunks = tuple(Chunk(i, f"{path} chunk {i}", 0, 1, 1, 1, 3) for i in range(n_chunks))
    return PreparedDocument(event=event, shard=shard, chunks=chunks, line_count=1)


def _submit_concurrently(batcher: EmbedBatcher, docs: list[PreparedDocument]) -> list[object]:
    results: list[object] = [None] * len(docs)
    barrier = threading.Barrier(len(docs))

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = batcher.index(docs[i], timeout=10)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(docs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_documents_submitted_together_share_requests_and_one_transaction_per_shard() -> None:
    embedder, stores = RecordingEmbedder(), [FakeStore(0), FakeStore(1)]
    batcher = EmbedBatcher(stage=EmbeddingStage(embedder=embedder, batch_size=16), stores=stores, max_chunks=1000,
                           max_wait_s=0.3)
    try:
        docs = [_doc(f"d{i}", shard=i % 2, n_chunks=3) for i in range(8)]
        outcomes = _submit_concurrently(batcher, docs)
    finally:
        batcher.close()
    assert all(isinstance(o, ApplyOutcome) and o.applied for o in outcomes)
    assert sum(embedder.requests) == 24 and embedder.requests == [16, 8]  # 8 documents, 2 requests
    assert [len(t) for t in stores[0].transactions] == [4] and [len(t) for t in stores[1].transactions] == [4]
    # every chunk got the vector of its own text
    change = stores[1].transactions[0][0]
    expected = HashingEmbedder(8).embed_documents([c.text for c in change.chunks])
    assert np.allclose(change.embeddings, expected)


def test_a_failing_shard_fails_only_its_documents() -> None:
    stores = [FakeStore(0), FakeStore(1, fail=True)]
    batcher = EmbedBatcher(stage=EmbeddingStage(embedder=RecordingEmbedder(), batch_size=64), stores=stores,
                           max_chunks=100, max_wait_s=0.3)
    try:
        outcomes = _submit_concurrently(batcher, [_doc("ok", 0, 2), _doc("bad", 1, 2)])
    finally:
        batcher.close()
    assert isinstance(outcomes[0], ApplyOutcome) and outcomes[0].applied
    assert isinstance(outcomes[1], StoreUnavailableError)


def test_provider_failure_reaches_every_waiter_as_a_transient_error() -> None:
    batcher = EmbedBatcher(stage=EmbeddingStage(embedder=RecordingEmbedder(fail=True), batch_size=64, max_retry_s=1),
                           stores=[FakeStore(0)], max_chunks=100, max_wait_s=0.05)
    try:
        with pytest.raises(EmbeddingProviderError, match="provider exploded"):
            batcher.index(_doc("x", 0, 1), timeout=5)
    finally:
        batcher.close()


def test_two_versions_of_one_document_in_a_batch_only_the_newest_counts_as_applied() -> None:
    stores = [FakeStore(0)]
    batcher = EmbedBatcher(stage=EmbeddingStage(embedder=RecordingEmbedder(), batch_size=64), stores=stores,
                           max_chunks=100, max_wait_s=0.3)
    try:
        old, new = _submit_concurrently(batcher, [_doc("same", 0, 1, seq=1), _doc("same", 0, 1, seq=2)])
    finally:
        batcher.close()
    assert isinstance(old, ApplyOutcome) and isinstance(new, ApplyOutcome)
    assert (old.applied, new.applied) == (False, True)


def test_a_zone_being_reindexed_is_written_with_both_models() -> None:
    """While a zone is reindexed, its shard lists two models: every write of the zone carries vectors of both,
    each from its own model's stage; other zones keep the default model alone."""
    default, other = RecordingEmbedder(), HashingEmbedder(16)
    stages = {"mini": EmbeddingStage(embedder=other, batch_size=16)}
    store = FakeStore(0, models={"z": ("default", "mini")})
    batcher = EmbedBatcher(stage=EmbeddingStage(embedder=default, batch_size=16), stores=[store], max_chunks=1000,
                           max_wait_s=0.2, stages=stages.__getitem__)
    try:
        reindexed = _doc("a", shard=0, n_chunks=2)
        plain = PreparedDocument(event=WriteEvent(op=Op.WRITE, zone="other", path="b", seq=1,
                                                  content_hash="sha256:" + "0" * 64),
                                 shard=0, chunks=reindexed.chunks, line_count=1)
        results = _submit_concurrently(batcher, [reindexed, plain])
    finally:
        batcher.close()
    assert all(isinstance(r, ApplyOutcome) and r.applied for r in results), results
    written = {c.event.zone: c for t in store.transactions for c in t}
    assert written["z"].models == {"default", "mini"}
    assert written["z"].model_embeddings["mini"].shape == (2, 16)
    np.testing.assert_allclose(written["z"].model_embeddings["mini"],
                               other.embed_documents([c.indexed_text for c in reindexed.chunks]), rtol=1e-6)
    assert written["z"].embeddings is not None and written["z"].embeddings.shape == (2, 8)
    assert written["other"].models == {"default"}


def test_a_write_refused_for_a_model_added_meanwhile_is_retried_and_the_models_read_again() -> None:
    """A reindex that starts between embedding and writing: the shard refuses the write (missing model); the
    waiter gets a transient error, and the next flush reads the zone's models again and carries both."""
    store = FakeStore(0)
    stages = {"mini": EmbeddingStage(embedder=HashingEmbedder(16), batch_size=16)}
    batcher = EmbedBatcher(stage=EmbeddingStage(embedder=HashingEmbedder(8), batch_size=16), stores=[store],
                           max_chunks=1000, max_wait_s=0.05, stages=stages.__getitem__, fill_ttl_s=3600)
    try:
        assert batcher.index(_doc("a", shard=0, n_chunks=1), timeout=10).applied
        store.models["z"] = ("default", "mini")  # the reindex starts; the batcher's copy is an hour "fresh"
        with pytest.raises(EmbeddingModelsChangedError, match="mini"):
            batcher.index(_doc("a", shard=0, n_chunks=1, seq=2), timeout=10)
        outcome = batcher.index(_doc("a", shard=0, n_chunks=1, seq=2), timeout=10)
    finally:
        batcher.close()
    assert outcome.applied
    assert store.transactions[-1][0].models == {"default", "mini"}
    assert store.model_reads == 2


def test_a_model_this_worker_lacks_fails_the_zones_documents_as_transient() -> None:
    store = FakeStore(0, models={"z": ("default", "unknown")})
    batcher = EmbedBatcher(stage=EmbeddingStage(embedder=HashingEmbedder(8), batch_size=16), stores=[store],
                           max_chunks=1000, max_wait_s=0.05)
    try:
        with pytest.raises(EmbeddingModelsChangedError, match="'unknown' is not configured"):
            batcher.index(_doc("a", shard=0, n_chunks=1), timeout=10)
    finally:
        batcher.close()
    assert store.transactions == []
