"""Cross-document embedding batches.

Embed tasks run concurrently in one worker process (a thread pool). Each submits its document here and
waits; a single flusher thread gathers the chunks of every document submitted within ``max_wait_s`` (up
to ``max_chunks``), has the :class:`~shardfuse.pipeline.embed.stage.EmbeddingStage` embed their distinct texts
together (cache first, then packed provider requests under backpressure), then hands the flush to the
:class:`~shardfuse.pipeline.index.shard_writer.ShardWriter`, which writes each shard's documents in one
transaction. A document whose chunks' request failed for good fails alone; the rest of the flush commits.
A task acknowledges its message only after its own document's transaction has committed, so batching
never weakens at-least-once delivery.

Embedding and writing overlap: the writer's thread commits one flush's shard transactions while the
flusher embeds the next (at most one embedded flush waits for the writer, so a slow database slows the
flusher down instead of piling up vectors).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from shardfuse.pipeline.config.settings import DEFAULT_MODEL
from shardfuse.pipeline.core.documents import PreparedDocument
from shardfuse.pipeline.core.errors import EmbeddingModelsChangedError, EmbeddingProviderError, ShardfuseError
from shardfuse.pipeline.embed.stage import EmbeddingStage, StageResult, StageStats, unique_texts
from shardfuse.pipeline.index.shard_writer import PendingWrite, ShardWriter, WriteBatch
from shardfuse.pipeline.index.store import ApplyOutcome, DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.bulk_load import BulkLoadGate

log = logging.getLogger(__name__)
# How long a shard's list of each zone's embedding models is reused before it is read again: a reindex's
# start or finish reaches this worker's writes within this long (the shard's transaction refuses a write that
# lacks a listed model at once; a write carrying one model too many is only wasted work).
FILL_TTL_S = 2.0


@dataclass(slots=True)
class _Pending:
    document: PreparedDocument
    fence: int | None = None
    future: Future[ApplyOutcome] = field(default_factory=Future)


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What one flush did: how many documents shared how many provider requests."""

    documents: int
    failed_documents: int
    embedding: StageStats
    write_ms: float

    @property
    def requests(self) -> int:
        return self.embedding.requests


# The key of the documents' ``dropped`` counts under which chunks the embedding model read only the start of
# are counted (the rest of their text is in BM25 but not in their vector): ``shardfuse status`` shows them.
TRUNCATED = "embedding_truncated"


def _with_truncated(dropped: dict[str, int], hashes: list[str], result: StageResult | None) -> dict[str, int]:
    cut = sum(h in result.truncated for h in hashes) if result is not None else 0
    return {**dropped, TRUNCATED: cut} if cut else dropped


class EmbedBatcher:
    """Gathers documents from concurrent callers into shared embedding requests and shard writes."""

    def __init__(
        self,
        *,
        stage: EmbeddingStage,
        stores: Sequence[ShardStore],
        max_chunks: int,
        max_wait_s: float,
        gate: BulkLoadGate | None = None,
        stages: Callable[[str], EmbeddingStage] | None = None,
        fill_ttl_s: float = FILL_TTL_S,
    ) -> None:
        self._stage = stage
        # Other embedding models' stages, by name, for zones being reindexed (built on first use).
        self._stages = stages
        # Per shard: when its zones' embedding models were read, and what they were.
        self._fill: dict[int, tuple[float, dict[str, tuple[str, ...]]]] = {}
        self._fill_ttl_s = fill_ttl_s
        self._stores = stores
        self._max_chunks = max_chunks
        self._max_wait_s = max_wait_s
        self._queue: queue.Queue[_Pending] = queue.Queue()
        self._closed = threading.Event()
        self.last_stats: BatchStats | None = None
        self._writer = ShardWriter(stores=stores, gate=gate, models_changed=self._forget_models)
        self._thread = threading.Thread(target=self._run, name="embed-batcher", daemon=True)
        self._thread.start()

    def submit(self, document: PreparedDocument, *, fence: int | None = None) -> Future[ApplyOutcome]:
        """Queue a document for the next flush; ``fence`` is the token of the caller's document lease."""
        if self._closed.is_set():
            raise RuntimeError("the embed batcher is closed")
        pending = _Pending(document, fence)
        self._queue.put(pending)
        return pending.future

    def index(self, document: PreparedDocument, *, timeout: float) -> ApplyOutcome:
        """Submit and wait for this document's shard transaction to commit."""
        return self.submit(document).result(timeout=timeout)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._writer.close(timeout=5)
        self._stage.close()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                first = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            batch = [first]
            chunks = len(first.document.chunks)
            deadline = time.monotonic() + self._max_wait_s
            while chunks < self._max_chunks:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
                batch.append(item)
                chunks += len(item.document.chunks)
            try:
                self._flush(batch)
            except Exception as exc:  # noqa: BLE001 - a bug here must not leave a waiter hanging
                log.exception("embedding a batch failed")
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)

    def _models(self, document: PreparedDocument) -> tuple[str, ...]:
        """The embedding models ``document``'s zone is written with, as its shard lists them (read at most
        once per ``fill_ttl_s``; the shard's transaction has the last word)."""
        shard = document.shard
        read_at, zones = self._fill.get(shard, (float("-inf"), {}))
        if time.monotonic() - read_at >= self._fill_ttl_s:
            try:
                zones = self._stores[shard].fill_models()
            except ShardfuseError:
                log.warning("could not read shard %d's embedding models; writing the default one", shard)
            self._fill[shard] = (time.monotonic(), zones)
        return zones.get(document.event.zone, (DEFAULT_MODEL,))

    def _forget_models(self, shard: int) -> None:
        """The shard's model lists changed (the writer heard it from the shard): read them again next flush."""
        self._fill.pop(shard, None)

    def _embed(self, model: str, members: list[_Pending]) -> StageResult:
        stage = self._stage if model == DEFAULT_MODEL else None
        if stage is None:
            if self._stages is None:
                raise EmbeddingModelsChangedError(f"embedding model {model!r} is not configured on this worker")
            stage = self._stages(model)
        chunks = [chunk for p in members for chunk in p.document.chunks]
        return stage.embed(unique_texts((c.embedding_key, c.indexed_text) for c in chunks), chunks=len(chunks))

    def _flush(self, batch: list[_Pending]) -> None:
        needs = [self._models(p.document) for p in batch]
        results: dict[str, StageResult] = {}
        failures: dict[int, ShardfuseError] = {}
        for model in sorted({m for models in needs for m in models}):
            members = [i for i, models in enumerate(needs) if model in models]
            try:
                results[model] = self._embed(model, [batch[i] for i in members])
            except Exception as exc:  # every waiter must hear about it, whatever it is (e.g. the cache is down)
                error = exc if isinstance(exc, ShardfuseError) else EmbeddingProviderError(
                    f"embedding failed: {exc!r}")
                for i in members:
                    failures.setdefault(i, error)

        by_shard: dict[int, list[PendingWrite]] = defaultdict(list)
        failed_documents = 0
        for i, p in enumerate(batch):
            hashes = [c.embedding_key for c in p.document.chunks]
            failure: Exception | None = failures.get(i)
            for model in needs[i]:
                if failure is None and model in results:
                    failure = next((results[model].failed[h] for h in hashes if h in results[model].failed), None)
            if failure is not None:  # only the documents whose request failed; the rest of the flush commits
                failed_documents += 1
                p.future.set_exception(failure if isinstance(failure, ShardfuseError) else EmbeddingProviderError(
                    f"embedding failed: {failure!r}"))
                continue
            vectors = {model: self._vectors(results[model], hashes) for model in needs[i]}
            change = DocumentChange(
                event=p.document.event,
                status=DocStatus.INDEXED,
                chunks=p.document.chunks,
                embeddings=vectors.pop(DEFAULT_MODEL, None),
                model_embeddings=vectors,
                line_count=p.document.line_count,
                dropped=_with_truncated(p.document.dropped, hashes, results.get(DEFAULT_MODEL)),
                refresh=p.document.refresh,
                fence=p.fence,
                blocks=p.document.blocks,
            )
            by_shard[p.document.shard].append(PendingWrite(change, p.future))

        stats = results.get(DEFAULT_MODEL) or next(iter(results.values()), None)
        embedding = stats.stats if stats else StageStats()
        # Blocks while the writer still has an earlier flush waiting: a slow database slows this thread down.
        self._writer.put(WriteBatch(by_shard, written=functools.partial(
            self._written, documents=len(batch), failed_documents=failed_documents, embedding=embedding,
            shards=len(by_shard))))

    @staticmethod
    def _vectors(result: StageResult, hashes: list[str]) -> np.ndarray:
        if not hashes:
            return np.zeros((0, 1), dtype=np.float32)
        return np.stack([result.vectors[h] for h in hashes]).astype(np.float32, copy=False)

    def _written(self, write_ms: float, *, documents: int, failed_documents: int, embedding: StageStats,
                 shards: int) -> None:
        """The writer committed a flush (on its thread): record and log what the flush did."""
        self.last_stats = BatchStats(documents=documents, failed_documents=failed_documents, embedding=embedding,
                                     write_ms=write_ms)
        log.info(
            "embedded %d chunks (%d distinct, %d from the cache) of %d documents in %d request(s) (%.0f ms, "
            "%d failed, %d oversize inputs, %d of them truncated), wrote %d shard(s) (%.0f ms)",
            embedding.chunks, embedding.unique, embedding.cache_hits, documents, embedding.requests,
            embedding.embed_ms, embedding.failed_requests, embedding.oversize, embedding.truncated, shards, write_ms,
        )
