"""SearchService over in-memory shards: fan-out, per-leg merge across shards, fusion, hydration."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from shardfuse.pipeline.config.settings import BoostSettings, QuerySettings, RouterSettings
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.lexical.stats import TermStats
from shardfuse.pipeline.index.store import ChunkFilter, ChunkRecord
from shardfuse.query.fusion import Fusion
from shardfuse.query.request import Mode, SearchRequest, parse_request
from shardfuse.query.search import SearchService
from shardfuse.query.shard_batches import ShardBatches
from shardfuse.query.shard_legs import LegHit


class FakeShard:
    def __init__(self, shard: int, *, keyword: list[LegHit], vector: list[LegHit], records: dict[str, str]) -> None:
        self.shard = shard
        self._keyword, self._vector, self._records = keyword, vector, records
        self.calls: list[tuple[str, str, int]] = []
        self.wheres: list[ChunkFilter | None] = []
        self.models: list[str] = []

    def keyword_stats(self, query: str, *, zone: str) -> TermStats:
        return TermStats(docs=len(self._records), df={query: len(self._keyword)})

    def keyword(
        self, query: str, *, zone: str, limit: int, where: ChunkFilter | None = None, stats: TermStats | None = None
    ) -> list[LegHit]:
        self.stats = stats
        self.calls.append(("keyword", zone, limit))
        self.wheres.append(where)
        return self._keyword[:limit]

    def vector(self, embedding: np.ndarray, *, zone: str, limit: int, where: ChunkFilter | None = None,
               model: str = "default") -> list[LegHit]:
        self.calls.append(("vector", zone, limit))
        self.models.append(model)
        self.wheres.append(where)
        return self._vector[:limit]

    def fetch(self, chunk_ids: Sequence[str], *, zone: str) -> dict[str, ChunkRecord]:
        known = [c for c in chunk_ids if c in self._records]
        return {c: ChunkRecord(c, zone, self._records[c], 1, 2, f"text of {c}") for c in known}

    def generation(self) -> int | None:
        return 3


# Routing and boosts off: these tests pin fan-out, merging and fusion exactly.
NEUTRAL_SETTINGS = QuerySettings(over_fetch=2, min_leg_depth=1, rrf_k=60, router=RouterSettings(enabled=False),
                                 boosts=BoostSettings(enabled=False))


def _service(*shards: FakeShard) -> SearchService:
    return SearchService(shards=shards, embedder=HashingEmbedder(16), settings=NEUTRAL_SETTINGS)


def _parse(**arguments: object) -> SearchRequest:
    """A request from a caller's arguments, as the search task parses them."""
    return parse_request(arguments, settings=QuerySettings())


def test_legs_are_merged_across_shards_by_score_then_fused() -> None:
    s0 = FakeShard(0, keyword=[LegHit("a", 9.0), LegHit("b", 2.0)], vector=[LegHit("b", 0.9)],
                   records={"a": "x/a.py", "b": "x/b.py"})
    s1 = FakeShard(1, keyword=[LegHit("c", 5.0)], vector=[LegHit("c", 0.95), LegHit("d", 0.1)],
                   records={"c": "y/c.py", "d": "y/d.py"})
    answer = _service(s0, s1).search(SearchRequest(query="q", zone="z", k=3))
    results = answer["results"]
    # keyword leg: a(9) c(5) b(2); vector leg: c(.95) b(.9) d(.1)
    assert [r["chunk_id"] for r in results] == ["c", "b", "a"]
    c = results[0]
    assert (c["keyword_rank"], c["vector_rank"], c["shard"], c["path"]) == (2, 1, 1, "y/c.py")
    assert c["keyword_score"] == 5.0 and c["vector_score"] == 0.95
    assert c["score"] == pytest.approx(1 / 62 + 1 / 61)
    assert [r["rank"] for r in results] == [1, 2, 3]
    # every shard was asked for k * over_fetch per leg, in the request's zone
    assert sorted(s0.calls) == [("keyword", "z", 6), ("vector", "z", 6)]
    assert answer["shards"]["queried"] == 2


def test_a_word_one_document_holds_ranks_it_first_in_the_default_fusion() -> None:
    # The keyword leg finds one chunk of the 6 it asked each shard for: it is complete, and the chunks it
    # missed scored nothing there. The vector leg fills its depth and ranks that chunk last (cosine
    # similarities sit close together: its last is over half its best).
    vector = [LegHit(c, s) for c, s in (("a", 0.9), ("b", 0.85), ("c", 0.8), ("d", 0.75), ("e", 0.7), ("u", 0.55))]
    shard = FakeShard(0, keyword=[LegHit("u", 7.5)], vector=vector, records={c: f"{c}.txt" for c in "abcdeu"})
    request = SearchRequest(query="zyxwv", zone="z", k=3, fusion=Fusion.RELATIVE, alpha=0.6)
    assert [r["chunk_id"] for r in _service(shard).search(request)["results"]][0] == "u"
    # A keyword leg that filled its depth is not complete: what it missed counts as its weakest.
    full = FakeShard(0, keyword=[LegHit(c, 9.0 - i) for i, c in enumerate("uvwxyz")], vector=vector,
                     records={c: f"{c}.txt" for c in "abcdeuvwxyz"})
    assert not _service(full)._fan_out.keyword("q", zones=["z"], where=ChunkFilter(), limit=6).complete
    assert _service(shard)._fan_out.keyword("q", zones=["z"], where=ChunkFilter(), limit=6).complete


def test_a_small_k_still_fetches_the_minimum_depth_per_leg() -> None:
    shard = FakeShard(0, keyword=[], vector=[], records={})
    service = SearchService(shards=[shard], embedder=HashingEmbedder(16),
                            settings=NEUTRAL_SETTINGS.model_copy(update={"min_leg_depth": 30}))
    service.search(SearchRequest(query="q", zone="z", k=3))
    service.search(SearchRequest(query="q", zone="z", k=20))
    assert [limit for _, _, limit in shard.calls] == [30, 30, 40, 40]  # max(k × over_fetch, 30)


def test_modes_use_only_their_leg() -> None:
    shard = FakeShard(0, keyword=[LegHit("a", 1.0)], vector=[LegHit("b", 0.5)], records={"a": "a", "b": "b"})
    service = _service(shard)
    keyword = service.search(SearchRequest(query="q", zone="z", mode=Mode.KEYWORD))
    assert [r["chunk_id"] for r in keyword["results"]] == ["a"] and "embed" not in keyword["timings_ms"]
    semantic = service.search(SearchRequest(query="q", zone="z", mode=Mode.SEMANTIC))
    assert [r["chunk_id"] for r in semantic["results"]] == ["b"] and semantic["results"][0]["keyword_rank"] is None


def test_hits_whose_chunks_are_gone_are_dropped_and_the_next_ones_fill_k() -> None:
    # "old" came from a BM25 generation built before its document was replaced: it no longer hydrates.
    shard = FakeShard(0, keyword=[LegHit("old", 9.0), LegHit("n1", 5.0), LegHit("n2", 4.0)], vector=[],
                      records={"n1": "p", "n2": "p"})
    answer = _service(shard).search(SearchRequest(query="q", zone="z", k=2, mode=Mode.KEYWORD))
    assert [r["chunk_id"] for r in answer["results"]] == ["n1", "n2"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"query": ""}, "non-empty"),
        ({"query": None}, "non-empty"),
        ({"query": "x" * 5000}, "limit"),
        ({"zone": ""}, "zone"),
        ({"zone": None}, "zone"),
        ({"k": 0}, "k must"),
        ({"k": 10**6}, "k must"),
        ({"k": "10"}, "k must"),
        ({"k": True}, "k must"),
        ({"mode": "fuzzy"}, "unknown mode"),
        ({"fusion": "borda"}, "unknown fusion"),
        ({"alpha": 1.5}, "alpha"),
        ({"alpha": "half"}, "alpha"),
        ({"rrf_k": 0}, "rrf_k"),
        ({"path_prefix": ""}, "path_prefix"),
        ({"filters": {"team": ["a"]}}, "filters"),
        ({"filters": "team=a"}, "filters"),
    ],
)
def test_invalid_requests_are_rejected_before_any_shard_is_touched(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"query": "q", "zone": "z", "k": 10, "mode": "hybrid", "fusion": "rrf", **kwargs}
    with pytest.raises(InvalidQueryError, match=message):
        _parse(**args)


def test_the_requested_fusion_decides_the_order() -> None:
    shard = FakeShard(0, keyword=[LegHit("a", 9.0), LegHit("b", 1.0)], vector=[LegHit("b", 0.9), LegHit("a", 0.1)],
                      records={"a": "a", "b": "b"})
    service = _service(shard)
    vector_only = service.search(_parse(query="q", zone="z", fusion="weighted", alpha=1.0))
    keyword_only = service.search(_parse(query="q", zone="z", fusion="weighted", alpha=0.0))
    assert [r["chunk_id"] for r in vector_only["results"]] == ["b", "a"]
    assert [r["chunk_id"] for r in keyword_only["results"]] == ["a", "b"]
    assert vector_only["fusion"] == "weighted" and vector_only["results"][0]["fused_score"] == 1.0


def test_results_are_diversified_per_file_and_only_the_top_carry_full_text() -> None:
    ids = [f"c{i}" for i in range(8)]
    records = {c: ("same.py" if i < 5 else f"other{i}.py") for i, c in enumerate(ids)}
    shard = FakeShard(0, keyword=[LegHit(c, 10.0 - i) for i, c in enumerate(ids)], vector=[], records=records)
    service = SearchService(shards=[shard], embedder=HashingEmbedder(16), settings=QuerySettings(
        over_fetch=2, max_chunks_per_file=2, full_text_top_n=2, snippet_chars=20))
    results = service.search(SearchRequest(query="q", zone="z", k=8, mode=Mode.KEYWORD))["results"]
    assert [r["chunk_id"] for r in results] == ["c0", "c1", "c5", "c6", "c7"]  # c2..c4: a third same.py
    assert [r["rank"] for r in results] == [1, 2, 3, 4, 5]
    assert [r["truncated"] for r in results] == [False, False, False, False, False]  # "text of cN" is short

    class LongText(FakeShard):
        def fetch(self, chunk_ids: Sequence[str], *, zone: str) -> dict[str, ChunkRecord]:
            return {c: ChunkRecord(c, zone, records[c], 1, 9, "word " * 50) for c in chunk_ids}

    long = LongText(0, keyword=[LegHit(c, 10.0 - i) for i, c in enumerate(ids)], vector=[], records=records)
    service = SearchService(shards=[long], embedder=HashingEmbedder(16), settings=QuerySettings(
        over_fetch=2, max_chunks_per_file=2, full_text_top_n=2, snippet_chars=20))
    results = service.search(SearchRequest(query="q", zone="z", k=8, mode=Mode.KEYWORD))["results"]
    assert [r["truncated"] for r in results] == [False, False, True, True, True]
    assert results[0]["text"] == "word " * 50 and len(results[2]["text"]) <= 20 and results[2]["text"].endswith("…")
    unlimited = SearchService(shards=[shard], embedder=HashingEmbedder(16),
                              settings=QuerySettings(over_fetch=2, max_chunks_per_file=0))
    assert len(unlimited.search(SearchRequest(query="q", zone="z", k=8, mode=Mode.KEYWORD))["results"]) == 8


def test_a_request_s_per_file_cap_overrides_the_setting() -> None:
    ids = [f"c{i}" for i in range(8)]
    records = {c: ("same.py" if i < 5 else f"other{i}.py") for i, c in enumerate(ids)}
    shard = FakeShard(0, keyword=[LegHit(c, 10.0 - i) for i, c in enumerate(ids)], vector=[], records=records)
    service = SearchService(shards=[shard], embedder=HashingEmbedder(16),
                            settings=QuerySettings(over_fetch=2, max_chunks_per_file=2))

    def ranked(**cap: int) -> list[str]:
        answer = service.search(SearchRequest(query="q", zone="z", k=8, mode=Mode.KEYWORD, **cap))
        return [r["chunk_id"] for r in answer["results"]]

    assert ranked() == ["c0", "c1", "c5", "c6", "c7"]  # the setting's 2
    assert ranked(max_per_file=1) == ["c0", "c5", "c6", "c7"]  # distinct files
    assert ranked(max_per_file=0) == ids  # no cap
    assert ranked(max_per_file=3) == ["c0", "c1", "c2", "c5", "c6", "c7"]


def test_filters_reach_both_legs_of_every_shard() -> None:
    shards = [FakeShard(i, keyword=[], vector=[], records={}) for i in range(2)]
    request = _parse(query="q", zone="z", path_prefix="src/", filters={"lang": "py"})
    _service(*shards).search(request)
    expected = ChunkFilter(path_prefix="src/", metadata={"lang": "py"})
    assert all(w == expected for shard in shards for w in shard.wheres) and all(len(s.wheres) == 2 for s in shards)
    _service(shards[0]).search(_parse(query="q", zone="z"))
    assert shards[0].wheres[-1] is None  # no filter: the legs run unfiltered


def test_every_shard_scores_with_the_zone_wide_statistics() -> None:
    shards = [FakeShard(i, keyword=[LegHit(f"k{i}", 1.0)] * (i + 1), vector=[], records={f"k{i}": "p"})
              for i in range(3)]
    _service(*shards).search(SearchRequest(query="q", zone="z", mode=Mode.KEYWORD))
    # Each fake shard holds one document and reports df = its number of keyword hits (1, 2, 3).
    assert all(shard.stats == TermStats(docs=3, df={"q": 6}) for shard in shards)


def test_the_router_widens_the_fetch_for_complex_queries_and_reports_its_plan() -> None:
    shard = FakeShard(0, keyword=[], vector=[], records={})
    service = SearchService(shards=[shard], embedder=HashingEmbedder(16),
                            settings=QuerySettings(over_fetch=2, min_leg_depth=1))
    service.search(SearchRequest(query="retry", zone="z", k=10))
    complex_query = ("how many trials compared aspirin versus placebo before 2010 and which of them "
                     "reported outcomes that changed after the follow-up?")
    answer = service.search(SearchRequest(query=complex_query, zone="z", k=10))
    limits = [limit for _, _, limit in shard.calls]
    assert limits[:2] == [20, 20]  # a plain one-word query fetches k × over_fetch
    assert min(limits[2:]) > 20 and answer["route"]["limit_multiplier"] > 1
    assert answer["route"]["vector_weight"] > answer["route"]["keyword_weight"]  # a long question leans vector
    off = service.search(SearchRequest(query=complex_query, zone="z", k=10, route=False))
    assert off["route"]["limit_multiplier"] == 1 and shard.calls[-1][2] == 20


def test_expansion_adds_legs_for_the_models_variants() -> None:
    import json

    from shardfuse.pipeline.config.settings import ExpansionSettings
    from shardfuse.query.expansion.expander import QueryExpander
    from tests.support.openai_server import CHAT_COMPLETIONS, FakeOpenAIServer, Reply

    shard = FakeShard(0, keyword=[LegHit("a", 1.0)], vector=[LegHit("b", 0.5)], records={"a": "a.py", "b": "b.py"})
    with FakeOpenAIServer() as server:
        server.script(CHAT_COMPLETIONS, [Reply.chat(json.dumps(
            {"lexical": ["retry backoff", "exponential retry"], "questions": ["how to retry?"],
             "passage": "Retries wait longer each time."}))])
        expansion = ExpansionSettings(enabled=True, base_url=server.base_url, api_key="sk-test", timeout_s=5)
        service = SearchService(shards=[shard], embedder=HashingEmbedder(16),
                                settings=NEUTRAL_SETTINGS.model_copy(update={"expansion": expansion}),
                                expander=QueryExpander(settings=expansion))
        answer = service.search(SearchRequest(query="backoff", zone="z", k=5))
        assert answer["expansion"]["source"] == "model"
        assert answer["expansion"]["legs"] == ["keyword+1", "keyword+2", "vector+1", "vector+2"]
        assert [c[0] for c in shard.calls].count("keyword") == 3 and [c[0] for c in shard.calls].count("vector") == 3
        assert len(server.requests(CHAT_COMPLETIONS)) == 1
        # Off for this request: no legs added, no request made.
        plain = service.search(SearchRequest(query="backoff", zone="z", k=5, expand=False))
        assert "expansion" not in plain and len(server.requests(CHAT_COMPLETIONS)) == 1
        service.close()


def test_expansion_failure_costs_nothing_but_time() -> None:
    from shardfuse.pipeline.config.settings import ExpansionSettings
    from shardfuse.query.expansion.expander import QueryExpander
    from tests.support.openai_server import CHAT_COMPLETIONS, FakeOpenAIServer, Reply

    shard = FakeShard(0, keyword=[LegHit("a", 1.0)], vector=[], records={"a": "a.py"})
    with FakeOpenAIServer() as server:
        server.script(CHAT_COMPLETIONS, [Reply(status=500), Reply(status=500)])
        expansion = ExpansionSettings(enabled=True, base_url=server.base_url, api_key="sk-test", timeout_s=2)
        service = SearchService(shards=[shard], embedder=HashingEmbedder(16),
                                settings=NEUTRAL_SETTINGS.model_copy(update={"expansion": expansion}),
                                expander=QueryExpander(settings=expansion))
        answer = service.search(SearchRequest(query="backoff", zone="z", k=5))
        assert answer["expansion"]["source"] == "failed" and [r["chunk_id"] for r in answer["results"]] == ["a"]
        service.close()


def test_boosts_rerank_fused_hits_and_explain_themselves() -> None:
    class Titled(FakeShard):
        def fetch(self, chunk_ids: Sequence[str], *, zone: str) -> dict[str, ChunkRecord]:
            titles = {"a": "Unrelated notes", "b": "Exponential backoff"}
            return {c: ChunkRecord(c, zone, f"{c}.md", 1, 2, "some text", metadata={"title": titles[c]})
                    for c in chunk_ids}

    shard = Titled(0, keyword=[LegHit("a", 2.0), LegHit("b", 1.9)], vector=[], records={"a": "a", "b": "b"})
    boosted = SearchService(shards=[shard], embedder=HashingEmbedder(16),
                            settings=NEUTRAL_SETTINGS.model_copy(update={"boosts": BoostSettings()}))
    results = boosted.search(SearchRequest(query="exponential backoff", zone="z", mode=Mode.KEYWORD))["results"]
    assert [r["chunk_id"] for r in results] == ["b", "a"]
    top = results[0]
    assert top["boost"] > 1 and top["score"] == pytest.approx(top["fused_score"] * top["boost"])
    assert any(reason.startswith("title") for reason in results[0]["boost_reasons"])
    off = boosted.search(SearchRequest(query="exponential backoff", zone="z", mode=Mode.KEYWORD, boost=False))
    assert [r["chunk_id"] for r in off["results"]] == ["a", "b"] and off["results"][0]["boost"] == 1.0


def test_hydration_fetches_one_window_unless_deleted_chunks_leave_fewer_than_k() -> None:
    class Counting(FakeShard):
        fetched: list[int] = []

        def fetch(self, chunk_ids: Sequence[str], *, zone: str) -> dict[str, ChunkRecord]:
            self.fetched.append(len(chunk_ids))
            return super().fetch(chunk_ids, zone=zone)

    ids = [f"c{i:02d}" for i in range(40)]
    live = {c: f"{c}.py" for c in ids[6:]}  # the six best were deleted since the index was built
    shard = Counting(0, keyword=[LegHit(c, 100.0 - i) for i, c in enumerate(ids)], vector=[], records=live)
    settings = NEUTRAL_SETTINGS.model_copy(update={"rerank_depth": 4, "over_fetch": 10})
    service = SearchService(shards=[shard], embedder=HashingEmbedder(16), settings=settings)
    results = service.search(SearchRequest(query="q", zone="z", k=2, mode=Mode.KEYWORD))["results"]
    assert [r["chunk_id"] for r in results] == ["c06", "c07"]
    assert shard.fetched == [4, 4]  # windows of max(1.5·k, rerank_depth) = 4, not all 20 candidates


def test_stage_switches_are_booleans_or_null() -> None:
    request = _parse(query="q", zone="z", boost=False, route=None, expand=True)
    assert (request.boost, request.route, request.expand) == (False, None, True)
    for name in ("boost", "route", "expand"):
        with pytest.raises(InvalidQueryError, match=name):
            _parse(query="q", zone="z", **{name: "yes"})


def test_uncached_searches_go_around_the_query_embedding_cache() -> None:
    from shardfuse.pipeline.embed.query_cache import CachedQueryEmbedder

    class Counting(HashingEmbedder):
        calls = 0

        def embed_query(self, text: str) -> np.ndarray:
            Counting.calls += 1
            return super().embed_query(text)

    model = Counting(16)
    shard = FakeShard(0, keyword=[], vector=[LegHit("a", 0.5)], records={"a": "a.py"})
    service = SearchService(shards=[shard], embedder=model, settings=NEUTRAL_SETTINGS,
                            cached_embedder=CachedQueryEmbedder(model, entries=8))
    request = SearchRequest(query="same query", zone="z", mode=Mode.SEMANTIC)
    service.search(request)
    service.search(request)
    assert Counting.calls == 1  # the second search found the embedding in the LRU
    service.search(request.model_copy(update={"cache": False}))
    assert Counting.calls == 2  # eval's timed searches always pay for the model


class TwoModels:
    """A zone's model as ``zone_models`` records it, with one embedder per model (``QueryModels``)."""

    def __init__(self, active: dict[str, str]) -> None:
        self.active_by_zone = active
        self.mini = HashingEmbedder(24)

    def active(self, zone: str) -> str:
        return self.active_by_zone.get(zone, "default")

    def embedders(self, model: str) -> tuple[HashingEmbedder, HashingEmbedder]:
        assert model == "mini"
        return self.mini, self.mini


def test_a_zone_switched_to_another_model_is_embedded_and_searched_with_that_model_only() -> None:
    shard = FakeShard(0, keyword=[], vector=[LegHit("a", 0.5)], records={"a": "a.py"})
    seen: list[int] = []
    original = shard.vector

    def vector(embedding: np.ndarray, **kwargs: object) -> list[LegHit]:
        seen.append(len(embedding))
        return original(embedding, **kwargs)  # type: ignore[arg-type]

    shard.vector = vector  # type: ignore[method-assign]
    models = TwoModels({"moved": "mini"})
    service = SearchService(shards=[shard], embedder=HashingEmbedder(16), settings=NEUTRAL_SETTINGS, models=models)
    moved = service.search(SearchRequest(query="q", zone="moved", mode=Mode.SEMANTIC))
    stayed = service.search(SearchRequest(query="q", zone="stayed", mode=Mode.SEMANTIC))
    assert (moved["model"], stayed["model"]) == ("mini", "default")
    assert shard.models == ["mini", "default"] and seen == [24, 16]  # embedding and column always agree
    # A request may name a model to compare it before the zone is switched.
    trial = service.search(SearchRequest(query="q", zone="stayed", mode=Mode.SEMANTIC, model="mini"))
    assert trial["model"] == "mini" and shard.models[-1] == "mini" and seen[-1] == 24


def test_a_model_the_query_worker_does_not_know_is_a_clear_error() -> None:
    shard = FakeShard(0, keyword=[], vector=[LegHit("a", 0.5)], records={"a": "a.py"})
    with pytest.raises(InvalidQueryError, match="'mini' is not configured"):
        _service(shard).search(SearchRequest(query="q", zone="z", model="mini"))
    with pytest.raises(InvalidQueryError, match="not an embedding model name"):
        _parse(query="q", zone="z", model="Bad Name!")


class PairBatch:
    """Two fake shards read as one batch (as query/shard_batches.py reads the shards of one database)."""

    def __init__(self, *shards: FakeShard) -> None:
        self._shards = {s.shard: s for s in shards}
        self.calls: list[str] = []

    @property
    def shards(self) -> tuple[int, ...]:
        return tuple(self._shards)

    def vector(self, embedding: np.ndarray, *, zone: str, limit: int, where: ChunkFilter | None,
               model: str) -> dict[int, list[LegHit]]:
        self.calls.append("vector")
        return {n: s.vector(embedding, zone=zone, limit=limit, where=where, model=model)
                for n, s in self._shards.items()}

    def fetch(self, asked: dict[tuple[int, str], list[str]]) -> dict[str, ChunkRecord]:
        self.calls.append("fetch")
        records: dict[str, ChunkRecord] = {}
        for (shard, zone), ids in asked.items():
            records.update(self._shards[shard].fetch(ids, zone=zone))
        return records


def test_shards_read_in_batches_answer_as_shards_read_one_by_one() -> None:
    def shards() -> list[FakeShard]:
        return [FakeShard(n, keyword=[LegHit(f"k{n}", 9.0 - n)], vector=[LegHit(f"v{n}", 0.9 - n / 10)],
                          records={f"k{n}": f"s{n}/k.py", f"v{n}": f"s{n}/v.py"}) for n in range(4)]

    one_by_one = _service(*shards()).search(SearchRequest(query="q", zone="z", k=8))
    batched_shards = shards()
    batches = (PairBatch(*batched_shards[:2]), PairBatch(*batched_shards[2:]))
    service = SearchService(shards=batched_shards, embedder=HashingEmbedder(16), settings=NEUTRAL_SETTINGS,
                            batches=ShardBatches(vector=batches, fetch=batches))
    batched = service.search(SearchRequest(query="q", zone="z", k=8))
    assert [(r["chunk_id"], r["shard"], r["path"], r["score"]) for r in batched["results"]] == [
        (r["chunk_id"], r["shard"], r["path"], r["score"]) for r in one_by_one["results"]]
    assert len(batched["results"]) == 8
    assert [b.calls for b in batches] == [["vector", "fetch"], ["vector", "fetch"]]  # one call per batch and step
