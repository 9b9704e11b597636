"""SearchService with a rerank stage (TEI's API on a local server): the answer's order, its ``rerank`` block,
the per-request switch, and which answers the result cache keeps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shardfuse.pipeline.config.rerank import RerankSettings
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.query.request import Mode, SearchRequest, parse_request
from shardfuse.query.rerank import build_stage
from shardfuse.query.search import SearchService
from shardfuse.query.shard_legs import LegHit
from tests.support.rerank_servers import TEI_RERANK, FakeRerankServer, rerank_error
from tests.unit.query.test_search_service import NEUTRAL_SETTINGS, FakeShard


class MemoryCache:
    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, answer: dict[str, Any]) -> None:
        self.entries[key] = answer


@pytest.fixture
def server() -> Iterator[FakeRerankServer]:
    running = FakeRerankServer()
    with running:
        yield running


def _service(server: FakeRerankServer | None, *, cache: MemoryCache | None = None, **rerank: Any) -> SearchService:
    # Fused (keyword) order a, b, c; each chunk's text is "text of <id>", so the query "c" makes c the best match.
    shard = FakeShard(0, keyword=[LegHit("a", 9.0), LegHit("b", 5.0), LegHit("c", 2.0)], vector=[],
                      records={"a": "a.py", "b": "b.py", "c": "c.py"})
    shard.current_index = lambda: "g1"  # type: ignore[attr-defined]
    settings = RerankSettings(provider="tei", base_url=server.root_url, **rerank) if server else RerankSettings()
    return SearchService(shards=[shard], embedder=HashingEmbedder(16), settings=NEUTRAL_SETTINGS,
                         rerank=build_stage(settings), cache=cache, write_versions=lambda: [1])


def _ids(answer: dict[str, Any]) -> list[str]:
    return [r["chunk_id"] for r in answer["results"]]


def test_the_answer_is_in_the_rerankers_order_and_says_so(server: FakeRerankServer) -> None:
    answer = _service(server).search(SearchRequest(query="c", zone="z", mode=Mode.KEYWORD, cache=False))
    assert _ids(answer) == ["c", "a", "b"]
    assert answer["results"][0]["score"] == 1.0 and answer["results"][0]["keyword_rank"] == 3
    assert answer["rerank"]["applied"] is True and answer["rerank"]["model"] == "tei"
    assert answer["timings_ms"]["rerank"] == answer["rerank"]["ms"]


def test_a_request_switches_reranking_off_or_on(server: FakeRerankServer) -> None:
    off = _service(server).search(parse_request({"query": "c", "zone": "z", "mode": "keyword", "rerank": False},
                                                settings=NEUTRAL_SETTINGS))
    assert _ids(off) == ["a", "b", "c"] and off["rerank"]["applied"] is False and not server.requests(TEI_RERANK)
    opt_in = _service(server, enabled=False)
    assert _ids(opt_in.search(SearchRequest(query="c", zone="z", mode=Mode.KEYWORD))) == ["a", "b", "c"]
    asked = opt_in.search(SearchRequest(query="c", zone="z", mode=Mode.KEYWORD, rerank=True))
    assert _ids(asked) == ["c", "a", "b"] and asked["rerank"]["applied"] is True


def test_without_a_reranker_nothing_changes_unless_one_is_asked_for() -> None:
    plain = _service(None).search(SearchRequest(query="c", zone="z", mode=Mode.KEYWORD))
    assert _ids(plain) == ["a", "b", "c"] and "rerank" not in plain
    asked = _service(None).search(SearchRequest(query="c", zone="z", mode=Mode.KEYWORD, rerank=True))
    assert _ids(asked) == ["a", "b", "c"] and asked["rerank"] == {
        "applied": False, "reason": "no reranker is configured (rerank.provider = none)"}


def test_an_answer_whose_rerank_fell_back_is_not_cached(server: FakeRerankServer) -> None:
    cache = MemoryCache()
    service = _service(server, cache=cache)
    request = SearchRequest(query="c", zone="z", mode=Mode.KEYWORD)
    server.script(TEI_RERANK, [rerank_error(429, "slow down", retry_after="60")])
    first = service.search(request)
    assert _ids(first) == ["a", "b", "c"] and first["cache"] == "miss" and not cache.entries
    second = service.search(request)  # the reranker is asked again, and this answer is kept
    assert _ids(second) == ["c", "a", "b"] and second["cache"] == "miss" and len(cache.entries) == 1
    assert service.search(request)["cache"] == "hit"
