"""Bulk-load mode against real PostgreSQL + pgvector: the HNSW index (and the grep blocks' GIN index) is
deferred for a large load, searches stay exact meanwhile, start-up does not rebuild it, and the build brings
both back valid."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from shardfuse.pipeline.core.documents import Chunk, TextBlock
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.bulk_load import BulkLoadGate
from shardfuse.pipeline.index.store.grep_blocks import block_grams
from shardfuse.pipeline.index.store.grep_store import GREP_INDEX
from shardfuse.pipeline.index.store.reads import VectorHit
from shardfuse.pipeline.index.store.vector_index import INDEX_NAME, BuildSettings, DeferPolicy
from tests.integration.conftest import Stack, scratch_store

pytestmark = pytest.mark.integration
DIM = 16
EMBED = HashingEmbedder(DIM)


@pytest.fixture
def store(stack: Stack) -> Iterator[ShardStore]:
    index = BuildSettings(m=8, ef_construction=32, memory_mb=64)
    with scratch_store(stack, "vindex", dimensions=DIM, index=index) as shard:
        yield shard


def _documents(start: int, count: int) -> list[DocumentChange]:
    changes = []
    for i in range(start, start + count):
        texts = [f"document {i} about topic {i % 17}", f"more words {i} on subject {i % 5}"]
        event = WriteEvent(op=Op.WRITE, zone="z", path=f"d{i}.txt", content_hash="sha256:" + "2" * 64, seq=1)
        chunks = tuple(Chunk(j, t, 0, len(t), j + 1, j + 1, 5) for j, t in enumerate(texts))
        changes.append(DocumentChange(event=event, status=DocStatus.INDEXED, chunks=chunks,
                                      embeddings=EMBED.embed_documents(texts), line_count=2,
                                      blocks=(TextBlock(1, "\n".join(texts)),)))
    return changes


def _index(store: ShardStore, name: str = INDEX_NAME) -> tuple[bool, str] | None:
    """(valid, definition) of the shard's index ``name`` (HNSW unless told), or None when it has none."""
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s", (name,)
        ).fetchone()
    return None if row is None else (bool(row[0]), str(row[1]))


def _exact_similarities(store: ShardStore, query: np.ndarray) -> dict[str, float]:
    """Every chunk of zone ``z`` and its similarity to ``query``, by an exact scan."""
    with store.pool.connection() as conn, conn.transaction():
        conn.execute("SET LOCAL enable_indexscan = off")
        rows = conn.execute("SELECT chunk_id, 1 - (embedding <=> %s) FROM shard_0.chunks WHERE zone = 'z'",
                            (query,)).fetchall()
    return {r[0]: float(r[1]) for r in rows}


def _assert_exact_top(hits: list[VectorHit], exact: dict[str, float], k: int) -> None:
    """``hits`` are an exact top ``k``: the best ``k`` similarities, each hit's its own. Among equal similarities
    (the hashing embedder makes ties) any order is exact."""
    best = sorted(exact.values(), reverse=True)[:k]
    assert [round(h.score, 5) for h in hits] == [round(score, 5) for score in best]
    assert all(round(exact[h.chunk_id], 5) == round(h.score, 5) for h in hits)


def test_a_bulk_load_defers_the_index_searches_stay_exact_and_the_build_restores_it(store: ShardStore) -> None:
    store.apply(_documents(0, 50))
    assert _index(store) is not None and _index(store)[0]  # type: ignore[index]
    backlog = [1500]  # documents said to wait in the queues
    gate = BulkLoadGate([store], policy=DeferPolicy(min_rows=1000), backlog=lambda: backlog[0], refresh_s=0)

    load = _documents(50, 100)
    gate.before_write(0, rows=200, documents=100)  # 200 + 1500 × 2 rows coming at a 100-row shard
    assert gate.deferred(0) and store.vector_index_deferred() and _index(store) is None
    assert _index(store, GREP_INDEX) is None  # the grep blocks' GIN index goes with it
    store.apply(load)

    query = EMBED.embed_query("document 77 about topic 9")
    hits = store.vector_search(query, zone="z", limit=10, ef_search=40)
    _assert_exact_top(hits, _exact_similarities(store, query), 10)
    grams = [block_grams("document 77 about", "z")]
    assert [b.path for b in store.grep_blocks(zone="z", any_of=grams, limit=10)] == ["d77.txt"]  # read unindexed

    store.ensure_schema()  # a worker starting during the load does not rebuild the index
    assert _index(store) is None

    assert _vacuumed(store) is None
    assert store.build_vector_index() is not None
    valid, definition = _index(store)  # type: ignore[misc]
    assert valid and "hnsw" in definition and "m='8'" in definition.replace(" ", "")
    valid, definition = _index(store, GREP_INDEX)  # type: ignore[misc]
    assert valid and "gin (grams)" in definition
    assert [b.path for b in store.grep_blocks(zone="z", any_of=grams, limit=10)] == ["d77.txt"]
    # Settled after the load: vacuumed and analysed now, not by autovacuum under the first queries.
    assert _vacuumed(store) is not None
    assert not store.vector_index_deferred() and not gate.deferred(0)
    store.ensure_schema()
    assert _index(store) is not None


def _vacuumed(store: ShardStore) -> object:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT last_vacuum, last_analyze FROM pg_stat_user_tables "
                           "WHERE schemaname = 'shard_0' AND relname = 'chunks'").fetchone()
    assert row is not None
    return None if row[0] is None or row[1] is None else row


def test_small_writes_keep_the_index(store: ShardStore) -> None:
    gate = BulkLoadGate([store], policy=DeferPolicy(min_rows=1000), backlog=lambda: 10, refresh_s=0)
    gate.before_write(0, rows=20, documents=10)
    assert not gate.deferred(0) and _index(store) is not None


def test_a_build_with_nothing_deferred_changes_nothing(store: ShardStore) -> None:
    store.apply(_documents(0, 20))
    before = _index(store)
    assert store.build_vector_index() is not None  # CREATE INDEX IF NOT EXISTS: a no-op
    assert _index(store) == before
    assert _vacuumed(store) is None  # nothing was loaded in bulk: nothing to settle
