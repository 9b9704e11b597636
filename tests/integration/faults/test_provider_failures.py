"""Fault: the embedding provider answers 20% of requests with an error (10% 429 with ``Retry-After``, 10%
500), through the real OpenAI client path.

How: the embed workers use provider ``openai`` (the ``openai`` SDK) pointed at the fake embeddings server
of ``tests/support/embeddings_server.py``, running in this test process on loopback (as
``tests/benchmarks/bench_embed_batching.py`` configures it). A clean zone is published with no faults;
then the server's fault rates are raised and the same corpus is published into another zone (under other
paths, so that the chunks' contexts differ and the embedding cache cannot answer for the provider).

What it proves: a 429 or 500 fails only its request, which the embedding stage retries (backoff, never
shorter than ``Retry-After``, the AIMD limit halving on 429s); what still fails fails only its documents,
whose tasks retry. Every document completes: the zone holds exactly what the clean zone holds (every
document once at its published seq, same per-path chunk counts and total, no duplicate ordinal or chunk id,
no dead letter), every one of its chunks really went through the failing provider, and search finds every
document on both legs (its unique word by keyword, its text by semantic search, with the provider's faults
turned off for the queries).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.integration.conftest import Stack
from tests.integration.faults.conftest import (
    StreamPublisher,
    assert_both_legs,
    assert_same_as_clean,
    drain,
    make_corpus,
    own_stack,
    publish_clean,
    rebuilds_resent,
    snapshot,
)
from tests.support.embeddings_server import FakeEmbeddingsServer
from tests.support.openai_server import Reply

DIMENSIONS = 64


class CountingServer(FakeEmbeddingsServer):
    """The fake embeddings server, counting the faults it injected by status."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.refused: dict[int, int] = {}
        self._count_lock = threading.Lock()

    def _refusal(self) -> Reply | None:
        reply = super()._refusal()
        if reply is not None:
            with self._count_lock:
                self.refused[reply.status] = self.refused.get(reply.status, 0) + 1
        return reply


@pytest.fixture(scope="module")
def provider() -> Iterator[CountingServer]:
    server = CountingServer(dimensions=DIMENSIONS, retry_after_s=0.2, seed=6)
    with server:
        yield server


@pytest.fixture(scope="module")
def stack(provider: CountingServer) -> Iterator[Stack]:
    extra = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "openai",
        "SHARDFUSE_EMBEDDER__MODEL": "text-embedding-3-small",
        "SHARDFUSE_EMBEDDER__DIMENSIONS": str(DIMENSIONS),
        "SHARDFUSE_EMBEDDER__API_KEY": "sk-faults",
        "SHARDFUSE_EMBEDDER__BASE_URL": provider.base_url,
        # Small requests (16 inputs, not the provider's 256): ~400 of them per run, so that a fifth failing
        # is ~80 failed requests spread over many messages rather than a handful.
        "SHARDFUSE_EMBEDDER__BATCH_SIZE": "16",
        # Within the embed task's wait for its documents (soft limit 25 s - 10 s): a request that keeps
        # failing fails its documents, whose task then retries, rather than running into the time limit.
        "SHARDFUSE_EMBEDDER__MAX_RETRY_S": "10",
    }
    with own_stack("provider_failures", extra) as running:
        yield running


@pytest.mark.integration
@pytest.mark.faults
@pytest.mark.timeout(600)
def test_a_fifth_of_provider_requests_failing_loses_nothing(stack: Stack, provider: CountingServer) -> None:
    corpus = make_corpus()
    clean, clean_s = publish_clean(stack, "clean", corpus, prefix="clean")
    clean_requests = len(provider.embedding_requests())
    print(f"\nclean run: {clean.summary()} in {clean_s:.1f} s, {clean_requests} requests, no faults")
    assert not provider.refused

    provider.error_rate_429 = 0.1
    provider.error_rate_5xx = 0.1
    inputs_before = provider.embedded_inputs
    started = time.monotonic()
    publisher = StreamPublisher(stack, "provider-faults", corpus, prefix="faulty")
    publisher.start()
    publisher.join_checked()
    drain(stack)
    fault = snapshot(stack.settings, "provider-faults", prefix="faulty")
    requests = len(provider.embedding_requests()) - clean_requests
    embedded = provider.embedded_inputs - inputs_before
    print(f"\nprovider faults: {requests} requests, refused {dict(provider.refused)}, {embedded} inputs embedded; "
          f"BM25 rebuilds re-sent by the maintenance worker: {rebuilds_resent(stack)}; "
          f"{fault.summary()} (clean {clean.summary()}); {time.monotonic() - started:.1f} s")
    assert_same_as_clean(fault, clean, seqs=publisher.seqs)
    # Search embeds its queries through the same provider: its faults are turned off first, so that a miss
    # says what the index holds, not that a query's embedding request failed.
    provider.error_rate_429 = provider.error_rate_5xx = 0.0
    assert_both_legs(stack, "provider-faults", corpus, prefix="faulty")
    assert provider.refused.get(429, 0) > 0 and provider.refused.get(500, 0) > 0, provider.refused
    assert embedded >= fault.chunk_total  # the embedding cache answered for none of them
