"""What a search answers with (issue 22, item 5), over in-memory shards that hold several zones: each zone
searched and hydrated on its own, symbol ranges, metadata, thresholds, depths, text or not, candidate counts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from shardfuse.pipeline.config.settings import BoostSettings, QuerySettings, RouterSettings
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.lexical.stats import TermStats
from shardfuse.pipeline.index.store import ChunkFilter, ChunkRecord
from shardfuse.pipeline.ingest.symbols import SymbolLines
from shardfuse.query.boosts import prepare_query
from shardfuse.query.request import Mode, SearchRequest
from shardfuse.query.search import SearchService
from shardfuse.query.shard_legs import LegHit
from shardfuse.query.symbol_ranges import named_definition, symbol_range


class ZonedShard:
    """A shard holding chunks of several zones: ``chunks[zone]`` maps chunk ids to records; every leg answers
    with the zone's chunks in order, scores falling from 1.0."""

    def __init__(self, shard: int, chunks: dict[str, dict[str, ChunkRecord]]) -> None:
        self.shard, self.chunks = shard, chunks
        self.fetched: list[tuple[str, tuple[str, ...]]] = []
        self.limits: list[tuple[str, str, int]] = []

    def keyword_stats(self, query: str, *, zone: str) -> TermStats:
        return TermStats(docs=len(self.chunks.get(zone, {})))

    def _hits(self, zone: str, limit: int) -> list[LegHit]:
        return [LegHit(cid, 1.0 - i / 10) for i, cid in enumerate(self.chunks.get(zone, {}))][:limit]

    def keyword(self, query: str, *, zone: str, limit: int, where: ChunkFilter | None = None,
                stats: TermStats | None = None) -> list[LegHit]:
        self.limits.append(("keyword", zone, limit))
        return self._hits(zone, limit)

    def vector(self, embedding: np.ndarray, *, zone: str, limit: int, where: ChunkFilter | None = None,
               model: str = "default") -> list[LegHit]:
        self.limits.append(("vector", zone, limit))
        return self._hits(zone, limit)

    def fetch(self, chunk_ids: Sequence[str], *, zone: str) -> dict[str, ChunkRecord]:
        self.fetched.append((zone, tuple(chunk_ids)))
        held = self.chunks.get(zone, {})
        return {cid: held[cid] for cid in chunk_ids if cid in held}

    def generation(self) -> int | None:
        return 1


SETTINGS = QuerySettings(over_fetch=2, min_leg_depth=1, router=RouterSettings(enabled=False),
                         boosts=BoostSettings(enabled=False))


def _record(chunk_id: str, zone: str, path: str, **fields: object) -> ChunkRecord:
    return ChunkRecord(chunk_id, zone, path, 10, 43, f"text of {path} in {zone}", **fields)  # type: ignore[arg-type]


def _search(shards: Sequence[ZonedShard], **fields: object) -> dict[str, object]:
    service = SearchService(shards=shards, embedder=HashingEmbedder(16), settings=SETTINGS)
    return service.search(SearchRequest.model_validate({"query": "q", **fields}))


def _two_zones() -> ZonedShard:
    """Zones "a" and "b" hold the same paths; "c", never named, too."""
    return ZonedShard(0, {zone: {f"{zone}{i}": _record(f"{zone}{i}", zone, f"src/f{i}.py") for i in range(3)}
                          for zone in ("a", "b", "c")})


def test_several_zones_are_searched_and_hydrated_each_on_its_own() -> None:
    shard = _two_zones()
    answer = _search([shard], zones=["a", "b"], k=10)
    results = answer["results"]
    assert isinstance(results, list)
    assert {r["chunk_id"] for r in results} == {"a0", "a1", "a2", "b0", "b1", "b2"}
    assert all(r["zone"] == r["chunk_id"][0] for r in results)  # each result says its own zone
    assert {zone for _, zone, _ in shard.limits} == {"a", "b"}  # "c" was never searched …
    assert {zone for zone, _ in shard.fetched} == {"a", "b"}  # … nor fetched from
    assert all(cid.startswith(zone) for zone, ids in shard.fetched for cid in ids)  # each id in its own zone
    assert answer["zone"] == "a" and answer["zones"] == ["a", "b"]
    # The same path in two zones is two files: the per-file cap does not merge them.
    assert sorted(r["path"] for r in results).count("src/f0.py") == 2


def test_a_record_of_another_zone_is_never_kept() -> None:
    """A shard that answered a fetch with another zone's chunk (a bug): the fan-out drops it."""
    leaky = _two_zones()
    leaky.chunks["a"]["a0"] = _record("a0", "c", "src/secret.py")
    answer = _search([leaky], zone="a", k=10)
    assert [r["chunk_id"] for r in answer["results"]] == ["a1", "a2"]  # type: ignore[index]


def test_zones_on_different_embedding_models_are_refused() -> None:
    class Models:
        def active(self, zone: str) -> str:
            return {"a": "default", "b": "bge"}[zone]

        def embedders(self, model: str) -> tuple[HashingEmbedder, HashingEmbedder]:
            return HashingEmbedder(16), HashingEmbedder(16)

    service = SearchService(shards=[_two_zones()], embedder=HashingEmbedder(16), settings=SETTINGS, models=Models())
    with pytest.raises(InvalidQueryError, match="one embedding model"):
        service.search(SearchRequest(query="q", zones=("a", "b")))


def test_thresholds_depths_text_and_candidate_counts() -> None:
    shard = _two_zones()
    answer = _search([shard], zone="a", k=10, mode=Mode.SEMANTIC, min_similarity=0.85, vector_depth=7)
    assert [r["chunk_id"] for r in answer["results"]] == ["a0", "a1"]  # type: ignore[index]  # 1.0, 0.9 ≥ 0.85
    assert ("vector", "a", 7) in shard.limits
    assert answer["candidates"] == {"legs": {"vector": 2}, "fused": 2, "hydrated": 2}

    hybrid = _search([shard], zone="a", k=10, keyword_depth=1, include_text=False)
    assert hybrid["candidates"] == {"legs": {"vector": 3, "keyword": 1}, "fused": 3, "hydrated": 3}
    assert all("text" not in r and "truncated" not in r for r in hybrid["results"])  # type: ignore[union-attr]
    scores = [r["score"] for r in hybrid["results"]]  # type: ignore[index]
    cut = _search([shard], zone="a", k=10, keyword_depth=1, include_text=False, min_score=scores[1])
    assert [r["score"] for r in cut["results"]] == scores[:2]  # type: ignore[index]


def test_metadata_travels_with_every_result_and_attribution_fields_on_their_own() -> None:
    metadata = {"title": "Retry guide", "url": "https://example.org/retry", "source": "wiki", "stars": 3}
    shard = ZonedShard(0, {"a": {"m": _record("m", "a", "guide.md", metadata=metadata),
                                 "n": _record("n", "a", "plain.md", metadata={"title": 7})}})
    results = _search([shard], zone="a")["results"]
    assert isinstance(results, list)
    first, second = results
    assert first["metadata"] == metadata
    assert (first["title"], first["url"], first["source"]) == ("Retry guide", "https://example.org/retry", "wiki")
    assert (second["metadata"], second["title"], second["url"]) == ({"title": 7}, None, None)


def test_a_result_naming_a_symbol_points_at_that_definition() -> None:
    lines = (SymbolLines("Cache", 0, 30), SymbolLines("get", 4, 9), SymbolLines("put", 11, 16))
    record = _record("s", "a", "cache.py", symbols=("Cache", "get", "put"), primary_symbol="Cache",
                     symbol_lines=lines)
    shard = ZonedShard(0, {"a": {"s": record}})
    (result,) = _search([shard], zone="a", query="put")["results"]  # type: ignore[misc]
    # The chunk is lines 10–43; put is its lines 11–16, so 21–26 of the file.
    assert (result["start_line"], result["end_line"]) == (21, 26)
    assert (result["chunk_start_line"], result["chunk_end_line"]) == (10, 43)
    assert result["symbol"] == {"name": "put", "start_line": 21, "end_line": 26}
    (plain,) = _search([shard], zone="a", query="caching strategy")["results"]  # type: ignore[misc]
    assert (plain["start_line"], plain["end_line"], plain["symbol"]) == (10, 43, None)


def test_which_definition_a_query_names() -> None:
    lines = (SymbolLines("Cache", 0, 30), SymbolLines("get", 4, 9), SymbolLines("parse_event", 12, 14),
             SymbolLines("Parser", 16, 20), SymbolLines("parser", 22, 24))

    def named(query: str) -> str | None:
        found = named_definition(prepare_query(query), lines)
        return None if found is None else found.name

    assert named("Cache.get()") == "get"  # the query is a name: its last segment
    assert named("Parser") == "Parser" and named("parser") == "parser"  # spelled the same first
    assert named("PARSER") == "parser"  # then ignoring case: the narrower of the two
    assert named("Cache get") == "get"  # several named: the narrowest
    assert named("how do we parse event payloads") == "parse_event"  # identifier parts, as the boost matches
    assert named("unrelated words") is None
    # A definition running past the chunk ends with it.
    past = symbol_range(prepare_query("get"), (SymbolLines("get", 4, 90),), start_line=10, end_line=43)
    assert past is not None and (past.start_line, past.end_line) == (14, 43)
