"""BM25 coverage asked of real PostgreSQL (pipeline/index/store/change_log.py): a commit that was never
marked in Redis, a flushed Redis, transactions that commit out of order, a shard created before the column
existed; and the monitors' view of it (``shardfuse wait``/status: workers/monitor.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fakeredis
import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg import sql

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.lexical import LexicalShardReader, Tokenizer, read_manifest
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.updates import ShardIndexer
from shardfuse.pipeline.index.maintenance import shard_mirror
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardStore, writes
from shardfuse.pipeline.index.store.vector_types import shard_vector_type
from shardfuse.workers import monitor
from tests.integration.conftest import Stack, scratch_store

pytestmark = pytest.mark.integration
DIM = 16
EMBED = HashingEmbedder(DIM)


@pytest.fixture
def store(stack: Stack) -> Iterator[ShardStore]:
    with scratch_store(stack, "changes", dimensions=DIM) as shard:
        yield shard


def _write(path: str, seq: int, text: str) -> DocumentChange:
    event = WriteEvent(op=Op.WRITE, zone="z", path=path, content_hash="sha256:" + "1" * 64, seq=seq)
    return DocumentChange(event=event, status=DocStatus.INDEXED, chunks=(Chunk(0, text, 0, len(text), 1, 1, 2),),
                          embeddings=EMBED.embed_documents([text]), line_count=1)


def _delete(path: str, seq: int) -> DocumentChange:
    return DocumentChange(event=WriteEvent(op=Op.DELETE, zone="z", path=path, seq=seq), status=DocStatus.DELETED)


def _indexer(root: Path, store: ShardStore, client: fakeredis.FakeRedis) -> ShardIndexer:
    return ShardIndexer(root=root, shard=0, store=store, freshness=Bm25Freshness(client), tokenizer=Tokenizer())


def _found(root: Path, word: str) -> set[str]:
    return {h.chunk_id for h in LexicalShardReader(root, 0).search(word, zone="z", k=50)}


def _paths(store: ShardStore, root: Path, word: str) -> set[str]:
    ids = _found(root, word)
    return {record.path for record in store.fetch_chunks(sorted(ids), zone="z").values()}


def test_unmarked_commits_and_a_flushed_redis_still_reach_bm25(store: ShardStore, tmp_path: Path) -> None:
    client = fakeredis.FakeRedis()
    job = _indexer(tmp_path, store, client)
    store.apply([_write(f"base-{i}.txt", 1, f"base document {i}") for i in range(5)])
    assert job.update()["kind"] == "merge"
    # Committed, never marked (the worker died between the commit and the bookkeeping) ...
    store.apply([_write("lost.txt", 1, "zanzibar lost")])
    # ... and marked, then Redis lost everything before the update ran.
    store.apply([_write("flushed.txt", 1, "zanzibar flushed"), _delete("base-0.txt", 2),
                 _write("base-1.txt", 2, "rewritten quokka")])
    Bm25Freshness(client).mark_dirty(0)
    client.flushall()
    result = job.update()
    assert result["kind"] == "delta"
    assert _paths(store, tmp_path, "zanzibar") == {"lost.txt", "flushed.txt"}
    assert _paths(store, tmp_path, "quokka") == {"base-1.txt"}
    assert _found(tmp_path, "base") and "base-0.txt" not in _paths(store, tmp_path, "base")
    assert job.update()["kind"] == "current"
    manifest = read_manifest(tmp_path, 0)
    assert manifest is not None and store.lexical_lag(manifest.built_snapshot).documents == 0


def test_a_transaction_that_commits_after_the_update_read_past_it_is_found_next(store: ShardStore,
                                                                               tmp_path: Path) -> None:
    """Transaction ids are drawn in one order and commit in another: a document written by a transaction
    that began first but committed after an update read the shard is still found by the next update (a
    plain sequence number would have been passed by then)."""
    job = _indexer(tmp_path, store, fakeredis.FakeRedis())
    store.apply([_write("base.txt", 1, "base document")])
    job.update()
    schema = sql.Identifier("shard_0")
    with psycopg.connect(str(store.pool.conninfo)) as slow, slow.transaction():
        register_vector(slow)
        writes.apply_changes(slow, schema, 0, [_write("slow.txt", 1, "wallaby slow")],
                             vector_type_of=lambda conn: shard_vector_type(conn, "shard_0"))
        store.apply([_write("fast.txt", 1, "wallaby fast")])  # a later transaction, committed first
        assert job.update()["kind"] == "delta"
        assert _paths(store, tmp_path, "wallaby") == {"fast.txt"}
        manifest = read_manifest(tmp_path, 0)
        assert manifest is not None and store.lexical_lag(manifest.built_snapshot).documents == 0
    # The slow transaction has committed now: the index lacks it, and says so.
    assert store.lexical_lag(manifest.built_snapshot).documents == 1
    assert job.update()["kind"] == "delta"
    assert _paths(store, tmp_path, "wallaby") == {"fast.txt", "slow.txt"}


def test_a_shard_from_before_the_change_column_migrates_and_is_rebuilt(store: ShardStore, tmp_path: Path) -> None:
    store.apply([_write("old.txt", 1, "numbat old")])
    with store.pool.connection() as conn:  # what a shard created by an older release looks like
        conn.execute("DROP INDEX shard_0.documents_change_xid")
        conn.execute("ALTER TABLE shard_0.documents DROP COLUMN change_xid")
    store.ensure_schema()
    with store.pool.connection() as conn:
        assert conn.execute("SELECT change_xid FROM shard_0.documents").fetchall() == [(None,)]
        assert conn.execute("SELECT to_regclass('shard_0.documents_change_xid')").fetchone() != (None,)
    assert store.lexical_lag(None).documents == 1  # an index that tracks nothing lacks every document
    assert _indexer(tmp_path, store, fakeredis.FakeRedis()).update()["kind"] == "merge"
    assert _paths(store, tmp_path, "numbat") == {"old.txt"}


def test_the_monitor_sees_a_shard_behind_from_postgres_after_redis_lost_everything(store: ShardStore,
                                                                                  tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, shards=1, postgres={"dsn": str(store.pool.conninfo)})
    client = fakeredis.FakeRedis()
    # Published to the shard's database, as the maintenance worker publishes: the monitor reads it there.
    job = ShardIndexer(root=settings.bm25_root, shard=0, store=store, freshness=Bm25Freshness(client),
                       tokenizer=Tokenizer(), publishing=shard_mirror(settings, store))
    store.apply([_write("a.txt", 1, "echidna")])
    job.update()
    assert monitor.stale_shards(settings, client) == []
    store.apply([_write("b.txt", 1, "echidna again")])
    client.flushall()  # nothing in Redis says shard 0 was written
    (row,) = monitor.bm25_freshness(settings, client)
    assert (row["current"], row["lag_versions"]) == (False, 1) and row["behind_s"] >= 0
    assert monitor.stale_shards(settings, client) == [0]
    job.update()
    assert monitor.stale_shards(settings, client) == []
