"""The embedding stage through the real OpenAI SDK against the fake server: distinct texts once, the cache
first, limits respected, only a failed request's chunks fail, transient errors retried."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from shardfuse.pipeline.embed.providers.input_limits import ProviderLimits
from shardfuse.pipeline.embed.providers.openai import OpenAIEmbedder
from shardfuse.pipeline.embed.stage import EmbeddingStage, unique_texts
from shardfuse.pipeline.index.store.embedding_cache import MemoryEmbeddingCache
from tests.support.embeddings_server import EMBEDDINGS, FakeEmbeddingsServer
from tests.support.openai_server import Reply, Responder

MODEL = "text-embedding-3-small"


@pytest.fixture()
def server() -> Iterator[FakeEmbeddingsServer]:
    with FakeEmbeddingsServer(dimensions=16) as fake:
        yield fake


def _stage(server: FakeEmbeddingsServer, **options: object) -> EmbeddingStage:
    embedder = OpenAIEmbedder(MODEL, api_key="sk-test", base_url=server.base_url, dimensions=16, timeout_s=5)
    defaults: dict[str, object] = {"batch_size": 4, "max_retry_s": 2.0, "sleep": lambda _s: None}
    return EmbeddingStage(embedder=embedder, **{**defaults, **options})  # type: ignore[arg-type]


def test_distinct_texts_are_embedded_once_in_requests_of_batch_size(server: FakeEmbeddingsServer) -> None:
    texts = unique_texts([(f"h{i % 6}", f"text {i % 6}") for i in range(20)])  # 20 chunks, 6 distinct
    result = _stage(server).embed(texts, chunks=20)
    assert set(result.vectors) == {f"h{i}" for i in range(6)} and not result.failed
    assert [len(r.json["input"]) for r in server.requests(EMBEDDINGS)] == [4, 2]
    assert (result.stats.chunks, result.stats.unique, result.stats.embedded, result.stats.requests) == (20, 6, 6, 2)
    for vector in result.vectors.values():
        assert vector.shape == (16,) and np.isclose(np.linalg.norm(vector), 1.0, atol=1e-5)


def test_the_cache_answers_before_the_provider(server: FakeEmbeddingsServer) -> None:
    cache = MemoryEmbeddingCache(dimensions=16)
    stage = _stage(server, cache=cache)
    first = stage.embed({"a": "alpha", "b": "beta"})
    second = stage.embed({"a": "alpha", "b": "beta", "c": "gamma"})
    assert server.embedded_inputs == 3  # alpha, beta, then only gamma
    assert second.stats.cache_hits == 2 and second.stats.embedded == 1
    assert (first.stats.cache_misses, second.stats.cache_misses) == (2, 1)
    np.testing.assert_array_equal(first.vectors["a"], second.vectors["a"])


def test_without_a_cache_every_text_is_embedded_and_none_counts_as_a_cache_miss(
        server: FakeEmbeddingsServer) -> None:
    stage = _stage(server)
    stage.embed({"a": "alpha"})
    again = stage.embed({"a": "alpha", "b": "beta"})
    assert server.embedded_inputs == 3
    assert (again.stats.cache_hits, again.stats.cache_misses, again.stats.embedded) == (0, 0, 2)


def test_a_request_that_fails_for_good_fails_only_its_chunks(server: FakeEmbeddingsServer) -> None:
    # The second request gets a permanent 400; the first and third succeed.
    server.script(EMBEDDINGS, [_passthrough(server), Reply(status=400), _passthrough(server)])
    texts = {f"h{i}": f"text {i}" for i in range(10)}
    result = _stage(server).embed(texts)
    assert set(result.failed) == {"h4", "h5", "h6", "h7"}
    assert set(result.vectors) == set(texts) - set(result.failed)
    assert result.stats.failed_requests == 1


def test_transient_errors_are_retried_until_they_pass(server: FakeEmbeddingsServer) -> None:
    server.script(EMBEDDINGS, [Reply(status=429, headers={"Retry-After": "0"}), Reply(status=503)])
    result = _stage(server).embed({"a": "alpha"})
    assert set(result.vectors) == {"a"} and not result.failed
    assert len(server.requests(EMBEDDINGS)) == 3


def test_oversize_inputs_follow_the_configured_rule(server: FakeEmbeddingsServer) -> None:
    long_text = "word " * 50
    class SmallInputs(OpenAIEmbedder):
        limits = ProviderLimits(max_inputs_per_request=8, max_tokens_per_request=1000, max_tokens_per_input=16,
                                default_batch_size=4)

    embedder = SmallInputs(MODEL, api_key="sk-test", base_url=server.base_url, dimensions=16, timeout_s=5)
    for rule, expected_inputs in (("truncate", 1), ("split", 4)):
        stage = EmbeddingStage(embedder=embedder, batch_size=4, oversize_rule=rule)  # type: ignore[arg-type]
        before = server.embedded_inputs
        result = stage.embed({"long": long_text})
        assert result.stats.oversize == 1 and set(result.vectors) == {"long"}
        assert server.embedded_inputs - before == expected_inputs
        assert np.isclose(np.linalg.norm(result.vectors["long"]), 1.0, atol=1e-5)


def _passthrough(server: FakeEmbeddingsServer) -> Responder:
    """A scripted step that answers like the server's own embeddings route."""
    return server._embeddings  # the route's default responder
