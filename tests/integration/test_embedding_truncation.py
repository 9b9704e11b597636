"""A chunk longer than the local model reads, through the real model, the embedding cache and a real shard:
truncated, it is counted on its document's row (what ``shardfuse status`` shows per zone); split into
averaged windows, it is not cut, and its vector is cached under its own key."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from shardfuse.pipeline.core.documents import Chunk, PreparedDocument
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.embed.batcher import TRUNCATED, EmbedBatcher
from shardfuse.pipeline.embed.providers import LocalEmbedder
from shardfuse.pipeline.embed.stage import EmbeddingStage
from shardfuse.pipeline.index.store import EmbeddingCache, ShardStore
from shardfuse.pipeline.index.store.inspection import chunk_quality
from tests.integration.conftest import Stack, scratch_store

pytestmark = pytest.mark.integration
LONG = " ".join(f"Trial {i} measured anisotropy in periventricular white matter of preterm infants." for i in range(40))


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    pytest.importorskip("sentence_transformers")
    return LocalEmbedder(runtime="torch")


@pytest.fixture
def store(stack: Stack) -> Iterator[ShardStore]:
    with scratch_store(stack, "truncation", dimensions=384) as shard:
        yield shard


def _document(path: str) -> PreparedDocument:
    event = WriteEvent(op=Op.WRITE, zone="z", path=path, content_hash="sha256:" + "2" * 64, seq=1)
    chunks = (Chunk(0, "a short chunk", 0, 13, 1, 1, 3), Chunk(1, LONG, 14, 14 + len(LONG), 2, 2, 700))
    return PreparedDocument(event=event, shard=0, chunks=chunks, line_count=2)


@pytest.mark.parametrize("rule", ["truncate", "split"])
def test_a_long_chunk_is_counted_where_a_user_sees_it(local: LocalEmbedder, store: ShardStore, rule: str) -> None:
    assert local.counter.count(LONG) > local.limits.max_tokens_per_input  # ~900 word-pieces, 256 read at once
    cache = EmbeddingCache(store.pool, provider="local", model=f"{local.name}-{uuid.uuid4().hex[:6]}",
                           dimensions=384)
    cache.ensure_schema()
    stage = EmbeddingStage(embedder=local, batch_size=16, cache=cache, oversize_rule=rule)  # type: ignore[arg-type]
    batcher = EmbedBatcher(stage=stage, stores=[store], max_chunks=100, max_wait_s=0.01)
    try:
        assert batcher.index(_document("long.txt"), timeout=60).applied
    finally:
        batcher.close()
    counts = chunk_quality(store).get("z", {}).get("dropped", {})
    long_hash = _document("long.txt").chunks[1].embedding_key
    if rule == "truncate":
        assert counts == {TRUNCATED: 1}
        assert set(cache.get_many([long_hash, f"{long_hash}/split"])) == {long_hash}
    else:
        assert counts == {}
        cached = cache.get_many([long_hash, f"{long_hash}/split"])
        assert set(cached) == {f"{long_hash}/split"}
        assert not np.allclose(cached[f"{long_hash}/split"], local.embed_query(LONG), atol=1e-3)
