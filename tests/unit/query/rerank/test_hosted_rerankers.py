"""The hosted rerankers through their real clients (the voyageai SDK; httpx for Cohere, Jina and TEI) against a
local server that speaks their APIs: a correct answer reorders the fused candidates; a 429, a timeout, a 5xx,
an unreadable answer or a refused connection leaves the fused order, says why, and stays within the budget."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import REGISTRY
from pydantic import SecretStr

from shardfuse.pipeline.config.rerank import RerankSettings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.index.store import ChunkRecord
from shardfuse.query.answer import Ranked
from shardfuse.query.boosts import NO_BOOST
from shardfuse.query.fusion import FusedHit
from shardfuse.query.rerank import build_stage
from shardfuse.query.rerank.stage import RerankStage, cacheable
from tests.support.openai_server import Reply
from tests.support.rerank_servers import RERANK, TEI_RERANK, FakeRerankServer, rerank_error

KEY = "rk-test-SECRET"
QUERY = "retry backoff jitter"
# Fused order a, b, c; by the server's word overlap c (3 of 3 words) > a (2 of 3) > b (none).
TEXTS = {"a": "exponential backoff and jitter", "b": "unrelated text", "c": "retry with backoff and jitter"}
FUSED = ["a", "b", "c"]
# Everything the step does beyond waiting for the server: Python, thread scheduling, the SDK's own work,
# on a loaded two-core machine. A fallback that waited for the server's 2 s sleep would be far outside it.
SLACK_S = 0.35


@dataclass(frozen=True)
class Provider:
    name: str
    path: str  # the route the client posts to

    def settings(self, server: FakeRerankServer, **extra: object) -> RerankSettings:
        base = server.base_url if self.name == "voyage" else server.root_url
        values: dict[str, object] = {"provider": self.name, "base_url": base, "api_key": SecretStr(KEY),
                                     "budget_ms": 1000, **extra}
        return RerankSettings.model_validate(values)


PROVIDERS = [Provider("voyage", RERANK), Provider("cohere", RERANK), Provider("jina", RERANK),
             Provider("tei", TEI_RERANK)]


@pytest.fixture
def server() -> Iterator[FakeRerankServer]:
    running = FakeRerankServer()
    with running:
        yield running


@pytest.fixture(params=PROVIDERS, ids=lambda p: p.name)
def provider(request: pytest.FixtureRequest) -> Provider:
    return request.param  # type: ignore[no-any-return]


def _ranked(ids: list[str] = FUSED) -> list[Ranked]:
    """Fused candidates in this order, with fused scores falling from 1."""
    return [((FusedHit(cid, 1.0 - i / 10), ChunkRecord(cid, "z", f"{cid}.py", 1, 2, TEXTS[cid])), 1.0 - i / 10,
             NO_BOOST) for i, cid in enumerate(ids)]


def _order(ranked: list[Ranked]) -> list[str]:
    return [pair[0].chunk_id for (pair, _, _) in ranked]


def _count(provider: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("shardfuse_reranks_total", {"provider": provider, "outcome": outcome}) or 0.0


def _apply(stage: RerankStage) -> tuple[list[Ranked], dict[str, object], float]:
    timings: dict[str, float] = {}
    started = time.monotonic()
    ranked, info = stage.apply(QUERY, _ranked(), requested=None, timings=timings)
    elapsed = time.monotonic() - started
    assert info is not None and timings["rerank"] == info["ms"]
    return ranked, info, elapsed


def test_a_correct_rerank_reorders_the_fused_candidates(server: FakeRerankServer, provider: Provider) -> None:
    stage = build_stage(provider.settings(server))
    before = _count(provider.name, "applied")
    ranked, info, _ = _apply(stage)
    stage.close()
    assert _order(ranked) == ["c", "a", "b"]
    assert [score for _, score, _ in ranked] == [1.0, pytest.approx(2 / 3), 0.0]  # the reranker's scores
    assert info["applied"] is True and info["candidates"] == 3 and "reason" not in info
    assert _count(provider.name, "applied") == before + 1
    sent = server.requests(provider.path)[0]
    assert sent.json["query"] == QUERY
    assert sent.json.get("documents", sent.json.get("texts")) == [TEXTS[c] for c in FUSED]
    if provider.name in ("cohere", "jina"):
        assert sent.bearer == KEY and sent.json["top_n"] == 3 and sent.json["model"] == str(info["model"]).split(":")[1]
    if provider.name == "voyage":
        assert sent.bearer == KEY and sent.json["model"] == "rerank-2.5"


def test_only_the_top_n_are_reranked_and_the_rest_keep_the_fused_order(server: FakeRerankServer) -> None:
    stage = build_stage(Provider("cohere", RERANK).settings(server, top_n=2))
    ranked, info, _ = _apply(stage)
    # a and b are sent (a scores 2/3, b 0); c, below top_n, stays third with its fused score.
    assert _order(ranked) == ["a", "b", "c"] and info["candidates"] == 2
    assert server.requests(RERANK)[0].json["documents"] == [TEXTS["a"], TEXTS["b"]]
    assert ranked[2][1] == pytest.approx(0.8)


def test_the_context_is_sent_in_front_of_the_text(server: FakeRerankServer) -> None:
    stage = build_stage(Provider("tei", TEI_RERANK).settings(server, max_chars=120))
    record = ChunkRecord("x", "z", "x.md", 1, 2, "body " * 100, context="guide > retries")
    stage.apply(QUERY, [((FusedHit("x", 1.0), record), 1.0, NO_BOOST)], requested=True, timings={})
    sent = server.requests(TEI_RERANK)[0].json["texts"][0]
    assert sent.startswith("guide > retries\n\nbody body") and len(sent) == 120


@pytest.mark.parametrize(
    ("replies", "outcome", "reason"),
    [
        ([rerank_error(429, "slow down", retry_after="30")], "rate_limited", "429"),
        # Whether the retry fits the 0.4 s budget depends on its jitter and the machine's load: either 5xx may
        # be the one reported (the retry itself is the next test's subject).
        ([rerank_error(503, "overloaded"), rerank_error(500, "boom")], "unavailable", "HTTP 50"),
        ([Reply(body=b"<html>bad gateway</html>", headers={"Content-Type": "text/html"})] * 2, "malformed", ""),
        ([Reply(json={"unexpected": True})] * 2, "malformed", ""),
        # Nested past what Python's json decoder recurses through: refused, never a RecursionError.
        ([Reply(body=b"[" * 50_000 + b"]" * 50_000, headers={"Content-Type": "application/json"})] * 2,
         "malformed", ""),
        ([Reply(delay_s=2.0, json={})], "timeout", "timed out"),
    ],
    ids=["429-retry-after-past-the-budget", "5xx", "not-json", "wrong-shape", "deep-json", "timeout"],
)
def test_failures_keep_the_fused_order_within_the_budget(
    server: FakeRerankServer, provider: Provider, replies: list[Reply], outcome: str, reason: str
) -> None:
    server.script(provider.path, replies)
    stage = build_stage(provider.settings(server, budget_ms=400))
    before = _count(provider.name, outcome)
    ranked, info, elapsed = _apply(stage)
    stage.close()
    assert _order(ranked) == FUSED and [score for _, score, _ in ranked] == [1.0, 0.9, 0.8]
    assert info["applied"] is False and str(info["reason"]).startswith(outcome) and reason in str(info["reason"])
    assert _count(provider.name, outcome) == before + 1
    assert elapsed <= 0.4 + SLACK_S, f"the fallback took {elapsed:.3f}s on a 0.4s budget"
    assert not cacheable({"rerank": info})  # the next query asks the reranker again


def test_a_429_whose_retry_after_fits_is_retried_within_the_budget(
    server: FakeRerankServer, provider: Provider
) -> None:
    server.script(provider.path, [rerank_error(429, "slow down", retry_after="0.2")])
    stage = build_stage(provider.settings(server, budget_ms=1500))
    ranked, info, elapsed = _apply(stage)
    assert info["applied"] is True and _order(ranked) == ["c", "a", "b"]
    assert len(server.requests(provider.path)) == 2 and 0.2 <= elapsed <= 1.5 + SLACK_S


def test_a_5xx_is_retried_within_the_budget(server: FakeRerankServer, provider: Provider) -> None:
    server.script(provider.path, [rerank_error(503, "overloaded")])
    stage = build_stage(provider.settings(server, budget_ms=1500))
    ranked, info, elapsed = _apply(stage)
    stage.close()
    assert info["applied"] is True and _order(ranked) == ["c", "a", "b"]
    assert len(server.requests(provider.path)) == 2 and elapsed <= 1.5 + SLACK_S


def test_a_refused_connection_keeps_the_fused_order(provider: Provider) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}" + ("/v1" if provider.name == "voyage" else "")
    stage = build_stage(RerankSettings.model_validate({"provider": provider.name, "base_url": base,
                                                       "api_key": KEY, "budget_ms": 400}))
    ranked, info, elapsed = _apply(stage)
    assert _order(ranked) == FUSED and str(info["reason"]).startswith("unavailable")
    assert elapsed <= 0.4 + SLACK_S


def test_a_rejected_key_is_not_retried(server: FakeRerankServer) -> None:
    server.script(RERANK, [rerank_error(401, "invalid api token")])
    ranked, info, _ = _apply(build_stage(Provider("cohere", RERANK).settings(server)))
    assert _order(ranked) == FUSED and len(server.requests(RERANK)) == 1
    assert str(info["reason"]).startswith("refused") and "SHARDFUSE_RERANK__API_KEY" in str(info["reason"])
    assert KEY not in str(info["reason"])


def test_hosted_providers_without_a_key_fail_when_built() -> None:
    for name in ("voyage", "cohere", "jina"):
        with pytest.raises(ConfigurationError, match="SHARDFUSE_RERANK__API_KEY"):
            build_stage(RerankSettings(provider=name))
