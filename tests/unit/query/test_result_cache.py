"""The result cache: hits while the shards are unchanged, never after a write or a rebuild."""

from __future__ import annotations

import fakeredis
import redis

from shardfuse.pipeline.config.settings import QuerySettings
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.query.request import Mode, SearchRequest
from shardfuse.query.result_cache import RedisResultCache, cache_key
from shardfuse.query.search import SearchService
from shardfuse.query.shard_legs import LegHit
from tests.unit.query.test_search_service import FakeShard


class VersionedShard(FakeShard):
    def __init__(self) -> None:
        super().__init__(0, keyword=[LegHit("a", 1.0)], vector=[], records={"a": "a.py"})
        self.generation_number = 1
        self.delta = ""
        self.searches = 0

    def keyword(self, *args: object, **kwargs: object) -> list[LegHit]:
        self.searches += 1
        return super().keyword(*args, **kwargs)  # type: ignore[arg-type]

    def current_index(self) -> str | None:
        return f"{self.generation_number}:{self.delta}"


def test_cached_until_a_write_or_a_rebuild_changes_the_shards() -> None:
    shard = VersionedShard()
    versions = [5]
    service = SearchService(shards=[shard], embedder=HashingEmbedder(8), settings=QuerySettings(),
                            cache=RedisResultCache(fakeredis.FakeRedis(), ttl_s=60), write_versions=lambda: versions)
    request = SearchRequest(query="q", zone="z", mode=Mode.KEYWORD)
    first, second = service.search(request), service.search(request)
    assert (first["cache"], second["cache"], shard.searches) == ("miss", "hit", 1)
    assert second["results"] == first["results"]
    versions[0] = 6  # a write committed
    assert service.search(request)["cache"] == "miss" and shard.searches == 2
    shard.generation_number = 2  # a rebuild published
    assert service.search(request)["cache"] == "miss" and shard.searches == 3
    shard.delta = "delta_1"  # the write's delta published: same generation, same write version
    assert service.search(request)["cache"] == "miss" and shard.searches == 4
    assert service.search(request)["cache"] == "hit" and shard.searches == 4
    uncached = SearchRequest(query="q", zone="z", mode=Mode.KEYWORD, cache=False)
    assert service.search(uncached).get("cache") is None and shard.searches == 5
    other = SearchRequest(query="q", zone="z", mode=Mode.KEYWORD, path_prefix="src/")
    assert service.search(other)["cache"] == "miss"  # filters are part of the key


def test_keys_separate_zones_and_parameters() -> None:
    state: list[tuple[int, str | None]] = [(1, "1")]
    base = SearchRequest(query="q", zone="a")
    assert cache_key(base, shard_state=state) == cache_key(SearchRequest(query="q", zone="a"), shard_state=state)
    assert cache_key(base, shard_state=state) != cache_key(SearchRequest(query="q", zone="b"), shard_state=state)
    assert cache_key(base, shard_state=state) != cache_key(SearchRequest(query="q", zone="a", k=11), shard_state=state)
    # A zone switched to another embedding model never gets the old model's answers.
    assert cache_key(base, shard_state=state) != cache_key(base, shard_state=state, model="mini")


def test_an_unreachable_redis_costs_only_the_cache() -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    cache = RedisResultCache(dead, ttl_s=60)
    assert cache.get("k") is None
    cache.put("k", {"results": []})  # swallowed, not raised


def test_other_query_settings_give_other_keys() -> None:
    from shardfuse.pipeline.config.settings import BoostSettings
    from shardfuse.query.result_cache import settings_fingerprint

    request, state = SearchRequest(query="q", zone="a"), [(1, "1")]
    default = settings_fingerprint(QuerySettings())
    assert default == settings_fingerprint(QuerySettings())
    unboosted = settings_fingerprint(QuerySettings(boosts=BoostSettings(enabled=False)))
    assert cache_key(request, shard_state=state, settings_fingerprint=default) != cache_key(
        request, shard_state=state, settings_fingerprint=unboosted)
