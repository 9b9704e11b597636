"""One contract for the remote embedders (OpenAI, Voyage): the real SDKs against a local fake server.

Nothing is patched: each adapter builds its SDK client pointed at :class:`FakeEmbeddingsServer`, so
request building, retries (off), timeouts, headers, base64 decoding and error mapping are all exercised.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import numpy as np
import pytest

from shardfuse.pipeline.core.errors import (
    ConfigurationError,
    EmbeddingProviderError,
    EmbeddingRequestError,
    PermanentError,
    RateLimitedError,
    TransientError,
)
from shardfuse.pipeline.embed.providers import OpenAIEmbedder, VoyageEmbedder, fit_input, merge_pieces
from shardfuse.pipeline.embed.providers.input_limits import ProviderLimits, TiktokenCounter
from tests.support.embeddings_server import EMBEDDINGS, FakeEmbeddingsServer, embeddings_error, fake_vector
from tests.support.openai_server import Reply

KEY = "sk-contract-test-key"
Remote = OpenAIEmbedder | VoyageEmbedder


@dataclass(frozen=True)
class Provider:
    """How to build one adapter against the fake server, and what it sends."""

    id: str
    model: str
    dimensions: int  # what the adapter asks for; the server honours the request
    make: Callable[..., Remote]
    size_field: str  # the request field carrying the size

    def build(self, server: FakeEmbeddingsServer, **overrides: Any) -> Remote:
        kwargs: dict[str, Any] = {
            "api_key": KEY, "base_url": server.base_url, "timeout_s": 5.0, "dimensions": self.dimensions,
        }
        return self.make(overrides.pop("model", self.model), **{**kwargs, **overrides})


PROVIDERS = [
    Provider("openai", "text-embedding-3-small", 64, OpenAIEmbedder, "dimensions"),
    Provider("voyage", "voyage-3.5", 256, VoyageEmbedder, "output_dimension"),
]


@pytest.fixture(params=PROVIDERS, ids=lambda p: p.id)
def provider(request: pytest.FixtureRequest) -> Provider:
    param: Provider = request.param
    return param


@pytest.fixture
def server() -> Iterator[FakeEmbeddingsServer]:
    fake = FakeEmbeddingsServer(dimensions=16)
    with fake:  # (its __enter__ is typed as the base class's)
        yield fake


def expected(text: str, dimensions: int) -> np.ndarray:
    return np.asarray(fake_vector(text, dimensions), dtype=np.float32)


# -- vectors -------------------------------------------------------------------------------------------


def test_shapes_dtype_and_unit_rows(provider: Provider, server: FakeEmbeddingsServer) -> None:
    server.normalize = False  # the adapter normalises whatever it gets
    embedder = provider.build(server)
    assert embedder.dimensions == provider.dimensions
    assert embedder.name == f"{provider.id}:{provider.model}:{provider.dimensions}"
    vectors = embedder.embed_documents(["alpha", "beta gamma", "日本語 テキスト", ""])
    assert vectors.dtype == np.float32 and vectors.shape == (4, provider.dimensions)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    query = embedder.embed_query("alpha")
    assert query.dtype == np.float32 and query.shape == (provider.dimensions,)
    assert embedder.embed_documents([]).shape == (0, provider.dimensions)
    assert server.embedded_inputs == 5  # the empty batch never reached the server


def test_rows_follow_the_response_index_not_its_order(provider: Provider, server: FakeEmbeddingsServer) -> None:
    server.shuffle = True
    texts = [f"document {i}" for i in range(12)]
    vectors = provider.build(server).embed_documents(texts)
    for text, row in zip(texts, vectors, strict=True):
        np.testing.assert_allclose(row, expected(text, provider.dimensions), atol=1e-6)
    assert server.embedded_inputs == 12


def test_identical_texts_give_identical_vectors(provider: Provider, server: FakeEmbeddingsServer) -> None:
    embedder = provider.build(server)
    a, b, c = embedder.embed_documents(["same text", "other text", "same text"])
    np.testing.assert_array_equal(a, c)
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(embedder.embed_documents(["same text"])[0], a)


# -- what reaches the server ------------------------------------------------------------------------------


def test_request_carries_key_model_size_and_input_type(provider: Provider, server: FakeEmbeddingsServer) -> None:
    embedder = provider.build(server)
    embedder.embed_documents(["a document"])
    embedder.embed_query("a query")
    documents, queries = server.embedding_requests()
    for request in (documents, queries):
        assert request.bearer == KEY
        assert request.json["model"] == provider.model
        assert request.json[provider.size_field] == provider.dimensions
    assert documents.json["input"] == ["a document"] and queries.json["input"] == ["a query"]
    if provider.id == "voyage":
        assert (documents.json["input_type"], queries.json["input_type"]) == ("document", "query")
        assert documents.json["truncation"] is False
    else:
        assert documents.json["encoding_format"] == "base64"


def test_rows_sent_as_float_lists_are_read_too(provider: Provider, server: FakeEmbeddingsServer) -> None:
    """Some OpenAI-compatible servers ignore ``encoding_format`` and always answer with float lists."""
    embedder = provider.build(server)
    as_base64 = embedder.embed_documents(["alpha", "beta"])
    server.floats_only = True
    as_floats = embedder.embed_documents(["alpha", "beta"])
    np.testing.assert_allclose(as_floats, as_base64, atol=1e-6)
    np.testing.assert_allclose(as_floats[0], expected("alpha", provider.dimensions), atol=1e-6)


def test_native_size_is_not_requested_from_models_that_cannot_shorten(server: FakeEmbeddingsServer) -> None:
    server.dimensions = 1536
    OpenAIEmbedder("text-embedding-ada-002", api_key=KEY, base_url=server.base_url).embed_query("x")
    server.dimensions = 512
    VoyageEmbedder("voyage-3-lite", api_key=KEY, base_url=server.base_url).embed_query("x")
    ada, lite = server.embedding_requests()
    assert "dimensions" not in ada.json
    assert lite.json["output_dimension"] is None


# -- failures ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "wait"),
    [({"Retry-After": "7"}, 7.0), ({"retry-after-ms": "250"}, 0.25), ({}, None)],
    ids=["seconds", "milliseconds", "absent"],
)
def test_429_is_rate_limited_with_retry_after(
    provider: Provider, server: FakeEmbeddingsServer, headers: dict[str, str], wait: float | None
) -> None:
    server.script(EMBEDDINGS, [embeddings_error(429, "slow down", headers=headers)])
    with pytest.raises(RateLimitedError) as caught:
        provider.build(server).embed_documents(["x"])
    assert caught.value.retry_after_s == wait
    assert isinstance(caught.value, EmbeddingProviderError) and isinstance(caught.value, TransientError)
    assert len(server.embedding_requests()) == 1  # the SDK did not retry


def test_429_retry_after_as_http_date(provider: Provider, server: FakeEmbeddingsServer) -> None:
    import time

    server.script(EMBEDDINGS, [embeddings_error(429, "later", headers={"Retry-After": formatdate(time.time() + 30,
                                                                                                    usegmt=True)})])
    with pytest.raises(RateLimitedError) as caught:
        provider.build(server).embed_documents(["x"])
    assert caught.value.retry_after_s is not None and 25 <= caught.value.retry_after_s <= 31


@pytest.mark.parametrize("status", [500, 503])
def test_5xx_is_transient_and_not_retried(provider: Provider, server: FakeEmbeddingsServer, status: int) -> None:
    server.script(EMBEDDINGS, [embeddings_error(status, "boom")])
    with pytest.raises(EmbeddingProviderError) as caught:
        provider.build(server).embed_documents(["x"])
    assert not isinstance(caught.value, RateLimitedError)
    # (The voyageai SDK puts its own words in place of a 5xx's body.)
    assert f"(HTTP {status}: " in str(caught.value) and provider.model in str(caught.value)
    assert len(server.embedding_requests()) == 1


def test_a_503_carries_the_wait_it_asks_for(provider: Provider, server: FakeEmbeddingsServer) -> None:
    server.script(EMBEDDINGS, [embeddings_error(503, "overloaded", headers={"Retry-After": "4"})])
    with pytest.raises(EmbeddingProviderError) as caught:
        provider.build(server).embed_documents(["x"])
    assert not isinstance(caught.value, RateLimitedError) and caught.value.retry_after_s == 4.0


@pytest.mark.parametrize(
    ("status", "hint"),
    [(401, "SHARDFUSE_EMBEDDER__API_KEY"), (400, "embedder.model"), (404, "embedder.base_url"), (403, "permissions")],
)
def test_client_errors_are_permanent_with_a_hint(
    provider: Provider, server: FakeEmbeddingsServer, status: int, hint: str
) -> None:
    server.script(EMBEDDINGS, [embeddings_error(status, "provider says no")])
    with pytest.raises(EmbeddingRequestError) as caught:
        provider.build(server).embed_documents(["x"])
    assert isinstance(caught.value, PermanentError) and caught.value.status == status
    assert hint in str(caught.value) and "provider says no" in str(caught.value)
    assert KEY not in str(caught.value)


def test_timeout_is_transient(provider: Provider, server: FakeEmbeddingsServer) -> None:
    server.script(EMBEDDINGS, [Reply(json={}, delay_s=3.0)])
    with pytest.raises(EmbeddingProviderError, match="timed out"):
        provider.build(server, timeout_s=0.3).embed_documents(["x"])


def test_unreachable_server_is_transient(provider: Provider) -> None:
    with FakeEmbeddingsServer() as stopped:
        base_url = stopped.base_url
    embedder = provider.make(provider.model, api_key=KEY, base_url=base_url, timeout_s=2.0,
                             dimensions=provider.dimensions)
    with pytest.raises(EmbeddingProviderError):
        embedder.embed_documents(["x"])


def test_wrong_vector_size_is_a_configuration_error(provider: Provider, server: FakeEmbeddingsServer) -> None:
    # An unknown model (a compatible server): no size is requested, so the server's own size comes back.
    server.dimensions = 24
    embedder = provider.build(server, model="compatible-model", dimensions=16)
    with pytest.raises(ConfigurationError, match="embedder.dimensions = 24"):
        embedder.embed_documents(["x"])


def test_malformed_response_is_transient(provider: Provider, server: FakeEmbeddingsServer) -> None:
    server.script(EMBEDDINGS, [Reply(json={"object": "list", "data": [], "model": "m",
                                           "usage": {"prompt_tokens": 0, "total_tokens": 0}})])
    with pytest.raises(EmbeddingProviderError, match="rows numbered"):
        provider.build(server).embed_documents(["x"])


def test_a_response_nested_too_deeply_is_transient_not_a_recursion_error(provider: Provider,
                                                                        server: FakeEmbeddingsServer) -> None:
    # Python's json decoder, which both SDKs use, recurses once per level: 50,000 levels exhaust the stack.
    server.script(EMBEDDINGS, [Reply(body=b"[" * 50_000 + b"]" * 50_000,
                                     headers={"Content-Type": "application/json"})])
    with pytest.raises(EmbeddingProviderError, match="nested too deeply"):
        provider.build(server).embed_documents(["x"])


def test_missing_key_is_a_configuration_error(provider: Provider, server: FakeEmbeddingsServer) -> None:
    with pytest.raises(ConfigurationError, match="SHARDFUSE_EMBEDDER__API_KEY"):
        provider.build(server, api_key="")


# -- load behaviour of the fake server, seen through the adapters -------------------------------------------


def test_concurrency_quota_answers_429_and_max_in_flight_is_recorded(
    provider: Provider, server: FakeEmbeddingsServer
) -> None:
    server.latency_s, server.max_concurrent, server.retry_after_s = 0.3, 2, 2
    embedder = provider.build(server)
    start = threading.Barrier(6)
    outcomes: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        start.wait()
        try:
            embedder.embed_documents([f"text {i}"])
            result = "ok"
        except RateLimitedError as exc:
            result = f"429:{exc.retry_after_s:g}"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert server.max_in_flight > 2  # requests arrived together; those over the quota were refused
    assert 1 <= outcomes.count("ok") <= 2 + (6 - server.max_in_flight)
    assert all(o in ("ok", "429:2") for o in outcomes) and "429:2" in outcomes
    assert server.embedded_inputs == outcomes.count("ok")


def test_per_minute_quota_and_injected_faults(provider: Provider, server: FakeEmbeddingsServer) -> None:
    server.requests_per_minute = 2
    embedder = provider.build(server)
    embedder.embed_documents(["one"])
    embedder.embed_documents(["two"])
    with pytest.raises(RateLimitedError) as caught:
        embedder.embed_documents(["three"])
    assert caught.value.retry_after_s is not None and 1 <= caught.value.retry_after_s <= 60
    server.requests_per_minute, server.error_rate_5xx = None, 1.0
    with pytest.raises(EmbeddingProviderError) as failed:
        embedder.embed_documents(["four"])
    assert not isinstance(failed.value, RateLimitedError)
    server.error_rate_5xx, server.error_rate_429 = 0.0, 1.0
    with pytest.raises(RateLimitedError):
        embedder.embed_documents(["five"])


# -- limits and oversize inputs ----------------------------------------------------------------------------


def test_batch_over_the_request_limit_is_refused_before_sending(
    provider: Provider, server: FakeEmbeddingsServer
) -> None:
    embedder = provider.build(server)
    too_many = ["x"] * (embedder.limits.max_inputs_per_request + 1)
    with pytest.raises(ValueError, match="pack smaller batches"):
        embedder.embed_documents(too_many)
    oversize = "word " * (embedder.limits.max_tokens_per_input + 10)
    with pytest.raises(ValueError, match="fit_input"):
        embedder.embed_documents([oversize])
    assert server.embedding_requests() == []


@pytest.mark.parametrize("rule", ["truncate", "split"])
def test_oversize_input_is_fitted_by_rule(provider: Provider, server: FakeEmbeddingsServer, rule: str) -> None:
    embedder = provider.build(server)
    # Small limits keep the test fast; the adapter's own counter does the counting.
    limits = ProviderLimits(max_inputs_per_request=8, max_tokens_per_request=10_000, max_tokens_per_input=60,
                            default_batch_size=8)
    text = " ".join(f"token{i} naïve café" for i in range(60))
    counter = embedder.counter
    assert counter.count(text) > limits.max_tokens_per_input

    short = fit_input("short text", counter, limits, rule)  # type: ignore[arg-type]
    assert short == (("short text",), False)

    pieces, was_oversize = fit_input(text, counter, limits, rule)  # type: ignore[arg-type]
    assert was_oversize
    assert all(0 < counter.count(piece) <= limits.max_tokens_per_input for piece in pieces)
    if rule == "truncate":
        assert len(pieces) == 1 and text.startswith(pieces[0]) and len(pieces[0]) < len(text)
    else:
        assert len(pieces) > 1 and "".join(pieces) == text
    vectors = embedder.embed_documents(list(pieces))
    merged = merge_pieces(vectors, [counter.count(piece) for piece in pieces])
    assert merged.shape == (embedder.dimensions,) and abs(float(np.linalg.norm(merged)) - 1.0) < 1e-5


# -- pure helpers -------------------------------------------------------------------------------------------


def test_counters_cut_on_character_boundaries_and_the_voyage_one_over_counts() -> None:
    exact, scaled = OpenAIEmbedder("text-embedding-3-small", api_key=KEY).counter, TiktokenCounter(
        scale=VoyageEmbedder("voyage-3", api_key=KEY).counter.scale
    )
    text = "日本語のテキスト🙂 " * 200 + "plain words " * 200
    assert scaled.count(text) >= exact.count(text) * 1.2
    for counter in (exact, scaled):
        pieces = counter.split(text, 50)
        assert "".join(pieces) == text and all(counter.count(p) <= 50 for p in pieces)
        assert "\ufffd" not in "".join(pieces)
        assert counter.truncate(text, 50) == pieces[0]
        assert counter.split("", 50) == [] and counter.truncate("fits", 50) == "fits"


def test_errors_survive_pickling() -> None:
    # Not about messages (those are JSON only): Celery's prefork pool hands a task's exception from the child
    # process to the parent through multiprocessing, which pickles it; an error class that cannot be rebuilt
    # from its pickle would be lost there.
    limited = pickle.loads(pickle.dumps(RateLimitedError("slow", retry_after_s=2.5)))
    assert isinstance(limited, RateLimitedError) and limited.retry_after_s == 2.5 and str(limited) == "slow"
    busy = pickle.loads(pickle.dumps(EmbeddingProviderError("busy", retry_after_s=1.5)))
    assert type(busy) is EmbeddingProviderError and busy.retry_after_s == 1.5 and str(busy) == "busy"
    rejected = pickle.loads(pickle.dumps(EmbeddingRequestError("bad key", status=401)))
    assert isinstance(rejected, EmbeddingRequestError) and rejected.status == 401


def test_dimension_rules_are_checked_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="only produces 1536"):
        OpenAIEmbedder("text-embedding-ada-002", api_key=KEY, dimensions=384)
    with pytest.raises(ConfigurationError, match="at most 1536"):
        OpenAIEmbedder("text-embedding-3-small", api_key=KEY, dimensions=2048)
    with pytest.raises(ConfigurationError, match="unknown OpenAI"):
        OpenAIEmbedder("compatible-model", api_key=KEY)
    with pytest.raises(ConfigurationError, match="256 or 512 or 1024 or 2048"):
        VoyageEmbedder("voyage-3-large", api_key=KEY, dimensions=384)
    with pytest.raises(ConfigurationError, match="produces 512"):
        VoyageEmbedder("voyage-3-lite", api_key=KEY, dimensions=1024)
    assert VoyageEmbedder("voyage-3-large", api_key=KEY, dimensions=2048).dimensions == 2048
    assert KEY not in repr(VoyageEmbedder("voyage-3", api_key=KEY))
