"""The result cache never serves an answer older than the published index (issue 20, item 5).

A search run between a commit and the BM25 delta that makes it searchable by keyword is cached; once the
delta is published the same search must be answered afresh, with the new document. In process: the
search service over a real shard (PostgreSQL + pgvector), its published bm25s index, and the result cache
and write versions in the stack's real Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shardfuse.pipeline.config.settings import QuerySettings
from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.lexical import LexicalShardReader, Tokenizer
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.updates import ShardIndexer
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardStore
from shardfuse.query.request import Mode, SearchRequest
from shardfuse.query.result_cache import RedisResultCache
from shardfuse.query.search import SearchService
from shardfuse.query.shard_legs import StoreShardSearcher
from tests.integration.conftest import Stack, scratch_store

pytestmark = pytest.mark.integration
DIM = 16
EMBED = HashingEmbedder(DIM)


@pytest.fixture
def store(stack: Stack) -> Iterator[ShardStore]:
    with scratch_store(stack, "cache", dimensions=DIM) as shard:
        yield shard


def _write(zone: str, path: str, text: str) -> DocumentChange:
    event = WriteEvent(op=Op.WRITE, zone=zone, path=path, content_hash="sha256:" + "2" * 64, seq=1)
    return DocumentChange(event=event, status=DocStatus.INDEXED, chunks=(Chunk(0, text, 0, len(text), 1, 1, 3),),
                          embeddings=EMBED.embed_documents([text]), line_count=1)


def _paths(answer: dict[str, object]) -> set[str]:
    results = answer["results"]
    assert isinstance(results, list)
    return {str(r["path"]) for r in results}


@pytest.mark.parametrize("mode", [Mode.KEYWORD, Mode.HYBRID])
def test_an_answer_cached_before_the_delta_is_not_served_after_it(stack: Stack, store: ShardStore,
                                                                  tmp_path: Path, mode: Mode) -> None:
    # A database of its own on the stack's Redis server: the stack's workers never see these shard keys.
    broker = redis.Redis.from_url(stack.settings.broker.url).connection_pool
    client = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=broker.connection_class, **{**broker.connection_kwargs, "db": 11}))
    freshness = Bm25Freshness(client)
    zone = f"cache-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "bm25"
    job = ShardIndexer(root=root, shard=0, store=store, freshness=freshness, tokenizer=Tokenizer())
    service = SearchService(
        shards=[StoreShardSearcher(store=store, lexical=LexicalShardReader(root, 0), ef_search=40)],
        embedder=EMBED, settings=QuerySettings(), cache=RedisResultCache(client, ttl_s=300),
        write_versions=lambda: freshness.dirty_versions(1),
    )
    try:
        store.apply([_write(zone, f"old-{i}.txt", f"platypus burrow number {i}") for i in range(3)])
        freshness.mark_dirty(0)
        job.update()
        request = SearchRequest(query="platypus burrow", zone=zone, mode=mode, k=10)
        first = service.search(request)
        assert first["cache"] == "miss" and _paths(first) == {f"old-{i}.txt" for i in range(3)}
        assert service.search(request)["cache"] == "hit"

        # A commit lands; its BM25 delta is not published yet.
        store.apply([_write(zone, "new.txt", "platypus burrow platypus burrow newest")])
        freshness.mark_dirty(0)
        between = service.search(request)
        assert between["cache"] == "miss"  # the commit changed the key
        assert service.search(request)["cache"] == "hit"  # and this answer is cached for its TTL ...

        assert job.update()["kind"] == "delta"  # ... until the delta is published
        after = service.search(request)
        assert after["cache"] == "miss" and "new.txt" in _paths(after)
        again = service.search(request)
        assert again["cache"] == "hit" and again["results"] == after["results"]
    finally:
        service.close()
        client.flushdb()
