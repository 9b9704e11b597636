"""Turn the chunks of one flush into vectors: cache, fit, pack, send under backpressure, retry, map back.

1. Chunks are identified by their content hash, so identical text anywhere in the flush (licence headers,
   boilerplate, an unchanged paragraph of a re-published document) is looked up and embedded once.
2. Every text is counted in the provider's own tokenizer (the local model's too: all-MiniLM-L6-v2 reads 256
   word-pieces) and one over its per-input limit is fitted by the configured rule: ``truncate`` embeds its
   first tokens, ``split`` embeds consecutive windows and averages them (weighted by tokens, normalised).
   Each such text is counted (``shardfuse_embedding_oversize_chunks_total``), and the result names the
   truncated ones, for the documents' rows (``shardfuse status``): no text is cut silently.
3. The embedding cache (``(provider, model, dimensions, chunk_hash) → vector``) answers what it knows; the
   vector of a text embedded as averaged windows is cached under its own key (``<hash>/split``), so
   switching the rule never serves the other rule's vector. Missing texts are packed in order into
   requests that respect the provider's inputs-per-request and tokens-per-request limits and ``batch_size``
   (for an in-process model, in order of length: each request is then padded little, ``length_sorted``).
4. Requests run on up to ``max_concurrent`` threads; each holds a backpressure lease (per-process AIMD
   limit plus the Redis-backed global limit) only around the provider call, and is retried with bounded
   exponential backoff that honours ``Retry-After``.
5. A request that still fails fails only its own chunks: the result says which hashes failed and why, and
   the caller fails only the documents holding them. New vectors go into the cache.

Nothing here knows about Celery, documents or shards.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardfuse.pipeline.core.errors import EmbeddingProviderError
from shardfuse.pipeline.core.http_api import call_with_retries, is_rate_limited
from shardfuse.pipeline.embed.limiters.backpressure import Backpressure, Outcome
from shardfuse.pipeline.embed.packing import Batch, PackItem, PackLimits, pack
from shardfuse.pipeline.embed.providers.base import Embedder, Vectors
from shardfuse.pipeline.embed.providers.input_limits import (
    OversizeRule,
    ProviderLimits,
    TokenCounting,
    fit_input,
    merge_pieces,
)
from shardfuse.pipeline.index.store.embedding_cache import ChunkEmbeddingCache
from shardfuse.pipeline.observability import metrics

log = logging.getLogger(__name__)

_UNLIMITED = 10**12


@dataclass(frozen=True, slots=True)
class StageStats:
    """What one call did, for logs, benchmarks and the issue's counters."""

    chunks: int = 0
    unique: int = 0
    cache_hits: int = 0
    cache_misses: int = 0  # distinct texts the cache was asked for and did not hold (0 without a cache)
    embedded: int = 0
    requests: int = 0
    failed_requests: int = 0
    oversize: int = 0  # distinct texts over the per-input limit (cache hits included)…
    truncated: int = 0  # …of which only the first tokens were read (rule "truncate")
    tokens: int = 0
    embed_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class StageResult:
    vectors: Mapping[str, Vectors]  # chunk hash → unit vector
    failed: Mapping[str, Exception]  # chunk hash → why its request finally failed
    stats: StageStats = field(default_factory=StageStats)
    truncated: frozenset[str] = frozenset()  # chunk hashes whose vector read only the start of their text


class _WordCounter:
    """Counts for an embedder without a token counter or limits (hashing: reads any length): sizes requests."""

    def count(self, text: str) -> int:
        return len(text.split())

    def truncate(self, text: str, max_tokens: int) -> str:
        return text

    def split(self, text: str, max_tokens: int) -> list[str]:
        return [text]


class EmbeddingStage:
    """Embeds chunk texts for one embedder, shared by every embed thread of a worker process."""

    def __init__(
        self,
        *,
        embedder: Embedder,
        batch_size: int,
        cache: ChunkEmbeddingCache | None = None,
        backpressure: Backpressure | None = None,
        oversize_rule: OversizeRule = "truncate",
        max_concurrent: int = 1,
        max_retry_s: float = 120.0,
        request_timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._embedder = embedder
        self._cache = cache
        self._backpressure = backpressure
        self._rule = oversize_rule
        self._max_retry_s = max_retry_s
        self._request_timeout_s = request_timeout_s
        self._sleep = sleep
        limits: ProviderLimits | None = getattr(embedder, "limits", None)
        counter: TokenCounting | None = getattr(embedder, "counter", None)
        self._limits = limits
        self._counter: TokenCounting = counter if counter is not None else _WordCounter()
        max_inputs = min(batch_size, limits.max_inputs_per_request) if limits is not None else batch_size
        max_tokens = limits.max_tokens_per_request if limits is not None else _UNLIMITED
        self._pack_limits = PackLimits(max_inputs=max_inputs, max_tokens=max_tokens)
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_concurrent), thread_name_prefix="embed-request")

    @property
    def dimensions(self) -> int:
        return self._embedder.dimensions

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def embed(self, texts: Mapping[str, str], *, chunks: int | None = None) -> StageResult:
        """Vectors for ``texts`` (chunk hash → text); ``chunks`` is how many chunks they came from."""
        started = time.perf_counter()
        tokens = {h: self._counter.count(text) for h, text in texts.items()}
        limit = self._limits.max_tokens_per_input if self._limits is not None else None
        oversize = {h for h, n in tokens.items() if limit is not None and n > limit}
        keys = {h: self._cache_key(h, oversize=h in oversize) for h in texts}
        cached = self._cached(keys)
        missing = {h: t for h, t in texts.items() if h not in cached}

        # Each missing text, as the pieces sent and their token counts.
        pieces: dict[str, tuple[tuple[str, int], ...]] = {}
        for chunk_hash, text in missing.items():
            if chunk_hash not in oversize:
                pieces[chunk_hash] = ((text, tokens[chunk_hash]),)
                continue
            assert self._limits is not None
            fitted = fit_input(text, self._counter, self._limits, self._rule)
            pieces[chunk_hash] = tuple((piece, self._counter.count(piece)) for piece in fitted.pieces)
        truncated = frozenset(oversize) if self._rule == "truncate" else frozenset()
        if oversize:
            log.warning("%d input(s) exceeded %s's per-input limit of %s tokens and were %s", len(oversize),
                        self._embedder.name, limit, "truncated" if truncated else "split into averaged windows")

        items = [PackItem(key=(h, i), tokens=n) for h, ps in pieces.items() for i, (_, n) in enumerate(ps)]
        if self._limits is not None and self._limits.length_sorted:  # requests of similar lengths: less padding
            items.sort(key=lambda item: item.tokens)
        texts_by_key = {(h, i): piece for h, ps in pieces.items() for i, (piece, _) in enumerate(ps)}
        batches = pack(items, self._pack_limits)
        outcomes = list(self._pool.map(lambda b: self._send(b, texts_by_key), batches))

        by_piece: dict[tuple[str, int], Vectors] = {}
        failed: dict[str, Exception] = {}
        for batch, outcome in zip(batches, outcomes, strict=True):
            if isinstance(outcome, Exception):
                failed.update((h, outcome) for h, _ in batch.keys)
                continue
            by_piece.update(zip(batch.keys, outcome, strict=True))

        fresh: dict[str, Vectors] = {}
        for chunk_hash, ps in pieces.items():
            if chunk_hash in failed:
                continue
            rows = np.stack([by_piece[(chunk_hash, i)] for i in range(len(ps))])
            weights = [max(1, n) for _, n in ps]
            fresh[chunk_hash] = rows[0] if len(ps) == 1 else merge_pieces(rows, weights)
        if self._cache is not None and fresh:
            self._cache.put_many({keys[h]: v for h, v in fresh.items()})
        stats = StageStats(
            chunks=len(texts) if chunks is None else chunks,
            unique=len(texts),
            cache_hits=len(cached),
            cache_misses=len(texts) - len(cached) if self._cache is not None else 0,
            embedded=len(fresh),
            requests=len(batches),
            failed_requests=sum(isinstance(o, Exception) for o in outcomes),
            oversize=len(oversize),
            truncated=len(truncated),
            tokens=sum(item.tokens for item in items),
            embed_ms=(time.perf_counter() - started) * 1000,
        )
        count(stats, model=self._embedder.name)
        return StageResult(vectors={**cached, **fresh}, failed=failed, stats=stats, truncated=truncated)

    def _cache_key(self, chunk_hash: str, *, oversize: bool) -> str:
        """A text that fits has one vector whatever the rule; an oversize one has one per rule. "truncate"
        keeps the plain hash: the vector of the text's first tokens, which is what the model made of it
        before inputs were fitted (it truncated silently), so caches filled back then stay valid."""
        return f"{chunk_hash}/{self._rule}" if oversize and self._rule != "truncate" else chunk_hash

    def _cached(self, keys: Mapping[str, str]) -> dict[str, Vectors]:
        """chunk hash → cached vector, for the hashes whose key the cache holds."""
        if self._cache is None or not keys:
            return {}
        found = self._cache.get_many(keys.values())
        return {h: found[key] for h, key in keys.items() if key in found}

    def _send(self, batch: Batch[tuple[str, int]], texts: Mapping[tuple[str, int], str]) -> Vectors | Exception:
        """One provider request, retried within the budget; its final error is returned, not raised."""
        inputs = [texts[key] for key in batch.keys]
        try:
            return call_with_retries(
                lambda: self._attempt(inputs, batch.tokens),
                max_retry_s=self._max_retry_s,
                on_rate_limited=self._on_rate_limited,
                sleep=self._sleep,
                provider=self._embedder.name.split(":", 1)[0],
            )
        except Exception as exc:  # noqa: BLE001 - the caller fails exactly this batch's chunks with it
            log.warning("an embedding request of %d input(s) failed for good: %s", len(inputs), exc)
            return exc

    def _attempt(self, inputs: list[str], tokens: int) -> Vectors:
        lease: AbstractContextManager[Any] = (
            self._backpressure.request(tokens, timeout_s=self._request_timeout_s)
            if self._backpressure is not None else nullcontext()
        )
        try:
            with lease:  # the slot is held only around the call, never during a retry's wait
                vectors = self._embedder.embed_documents(inputs)
        except EmbeddingProviderError as exc:
            if self._backpressure is not None and not is_rate_limited(exc):
                self._backpressure.record(Outcome.failed())
            raise
        if self._backpressure is not None:
            self._backpressure.record(Outcome.success())
        return vectors

    def _on_rate_limited(self, retry_after_s: float | None) -> None:
        if self._backpressure is not None:
            self._backpressure.on_rate_limited(retry_after_s)


def count(stats: StageStats, *, model: str) -> None:
    """Add one call's stats to the deployment's metrics (:mod:`shardfuse.pipeline.observability.metrics`)."""
    labels = {"provider": model.split(":", 1)[0], "model": model}
    metrics.inc(metrics.EMBEDDING_CHUNKS, stats.chunks, **labels)
    metrics.inc(metrics.EMBEDDING_CACHE_HITS, stats.cache_hits, **labels)
    metrics.inc(metrics.EMBEDDING_CACHE_MISSES, stats.cache_misses, **labels)
    metrics.inc(metrics.EMBEDDING_TEXTS, stats.embedded, **labels)
    metrics.inc(metrics.EMBEDDING_TOKENS, stats.tokens, **labels)
    metrics.inc(metrics.EMBEDDING_REQUESTS, stats.requests - stats.failed_requests, outcome="ok", **labels)
    metrics.inc(metrics.EMBEDDING_REQUESTS, stats.failed_requests, outcome="failed", **labels)
    metrics.inc(metrics.EMBEDDING_OVERSIZE, stats.truncated, handling="truncated", **labels)
    metrics.inc(metrics.EMBEDDING_OVERSIZE, stats.oversize - stats.truncated, handling="split", **labels)


def unique_texts(texts_and_hashes: Iterable[tuple[str, str]]) -> dict[str, str]:
    """chunk hash → text, each hash once (the first text wins; equal hashes mean equal text)."""
    unique: dict[str, str] = {}
    for chunk_hash, text in texts_and_hashes:
        unique.setdefault(chunk_hash, text)
    return unique
