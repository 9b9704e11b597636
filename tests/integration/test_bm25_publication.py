"""BM25 indexes published in PostgreSQL (pipeline/index/store/lexical_publication.py) and followed by nodes that
share no directory (pipeline/index/lexical/mirror.py, follower.py): each "node" below is its own temporary
directory; only the shard's database is shared."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import fakeredis
import pytest

from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.errors import SchemaMissingError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.lexical import LexicalShardReader, ShardManifest, Tokenizer, read_manifest
from shardfuse.pipeline.index.lexical.follower import IndexFollower
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.mirror import UPLOAD_STAMP, ShardMirror
from shardfuse.pipeline.index.lexical.updates import ShardIndexer
from shardfuse.pipeline.index.maintenance import manifest_readers
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.lexical_publication import PART_BYTES, PostgresLexicalPublication
from shardfuse.pipeline.index.store.manifest_poll import PublishedManifests
from shardfuse.pipeline.index.store.schema import shard_schema
from tests.integration.conftest import Stack, scratch_store

pytestmark = pytest.mark.integration
DIM = 16
EMBED = HashingEmbedder(DIM)


@pytest.fixture
def store(stack: Stack) -> Iterator[ShardStore]:
    with scratch_store(stack, "published", dimensions=DIM) as shard:
        yield shard


def _write(path: str, seq: int, text: str) -> DocumentChange:
    event = WriteEvent(op=Op.WRITE, zone="z", path=path, content_hash="sha256:" + "1" * 64, seq=seq)
    return DocumentChange(event=event, status=DocStatus.INDEXED, chunks=(Chunk(0, text, 0, len(text), 1, 1, 2),),
                          embeddings=EMBED.embed_documents([text]), line_count=1)


def _mirror(root: Path, store: ShardStore) -> ShardMirror:
    published = PostgresLexicalPublication(store.pool, store.shard, schema=shard_schema(store.shard))
    return ShardMirror(root, published)


def _builder(root: Path, store: ShardStore) -> ShardIndexer:
    return ShardIndexer(root=root, shard=store.shard, store=store, freshness=Bm25Freshness(fakeredis.FakeRedis()),
                        tokenizer=Tokenizer(), publishing=_mirror(root, store))


def _paths(root: Path, store: ShardStore, word: str) -> set[str]:
    hits = LexicalShardReader(root, store.shard).search(word, zone="z", k=50)
    return {r.path for r in store.fetch_chunks([h.chunk_id for h in hits], zone="z").values()}


def test_a_node_with_an_empty_directory_serves_what_another_node_published(store: ShardStore, tmp_path: Path) -> None:
    builder_dir, query_dir = tmp_path / "maintenance-a", tmp_path / "query-b"
    store.apply([_write(f"doc-{i}.txt", 1, f"common words {i} wombat" if i % 3 == 0 else f"common words {i}")
                 for i in range(30)])
    assert _builder(builder_dir, store).update()["kind"] == "merge"

    follower = IndexFollower([_mirror(query_dir, store)], interval_s=0.05)
    assert not follower.ready
    follower.sync()
    assert follower.ready and follower.status()["shards"][store.shard]["installed"].startswith("gen_")
    assert _paths(query_dir, store, "wombat") == _paths(builder_dir, store, "wombat") == {
        f"doc-{i}.txt" for i in range(0, 30, 3)}
    assert read_manifest(query_dir, store.shard) == read_manifest(builder_dir, store.shard)

    # A delta published by the builder reaches the query node on its next round.
    store.apply([_write("late.txt", 1, "wombat arrives late"), _write("doc-0.txt", 2, "no longer about it")])
    assert _builder(builder_dir, store).update()["kind"] == "delta"
    follower.sync()
    assert _paths(query_dir, store, "wombat") == {"late.txt"} | {f"doc-{i}.txt" for i in range(3, 30, 3)}


def test_a_new_maintenance_node_continues_with_deltas(store: ShardStore, tmp_path: Path) -> None:
    store.apply([_write(f"doc-{i}.txt", 1, f"alpha {i}") for i in range(20)])
    assert _builder(tmp_path / "old-node", store).update()["kind"] == "merge"
    store.apply([_write("one.txt", 1, "kiwi one")])
    assert _builder(tmp_path / "old-node", store).update()["kind"] == "delta"

    # The old node is gone; a new one on an empty directory fetches the generation and its delta, and
    # builds the next delta on them instead of rebuilding the shard.
    store.apply([_write("two.txt", 1, "kiwi two")])
    fresh = tmp_path / "new-node"
    result = _builder(fresh, store).update()
    assert result["kind"] == "delta", result
    query_dir = tmp_path / "query"
    _mirror(query_dir, store).follow()
    assert _paths(query_dir, store, "kiwi") == {"one.txt", "two.txt"}


def test_a_stale_local_copy_under_a_published_name_is_fetched_again(store: ShardStore, tmp_path: Path) -> None:
    store.apply([_write(f"doc-{i}.txt", 1, f"beta {i}") for i in range(10)])
    builder = _builder(tmp_path / "builder", store)
    manifest_name = builder.update()["generation"]
    query_dir = tmp_path / "query"
    mirror = _mirror(query_dir, store)
    manifest = mirror.follow()
    assert manifest is not None and manifest.generation == manifest_name
    # The node restarts with a directory of that name from another upload (its cache outlived a database
    # restored from a backup, say): the name alone does not make it the published copy.
    copy = query_dir / f"shard_{store.shard}" / manifest.directory
    (copy / UPLOAD_STAMP).write_text("another-upload")
    (copy / "chunk_ids.npy").write_bytes(b"garbage")
    (query_dir / f"shard_{store.shard}" / "MANIFEST.json").unlink()
    mirror.follow()
    assert (copy / UPLOAD_STAMP).read_text() != "another-upload"
    assert len(_paths(query_dir, store, "beta")) == 10


def test_shared_storage_keeps_only_what_readers_may_still_need(store: ShardStore, tmp_path: Path) -> None:
    builder = _builder(tmp_path / "builder", store)
    for round_ in range(5):
        store.apply([_write(f"r{round_}-{i}.txt", 1, f"gamma {round_} {i}") for i in range(5)])
        builder.update()
        builder.merge()
    published = PostgresLexicalPublication(store.pool, store.shard, schema=shard_schema(store.shard))
    generations = [s for s in published.segments() if s.startswith("gen_")]
    assert len(generations) <= 2, generations
    manifest = published.manifest()
    assert manifest is not None and manifest.directory in generations


def test_files_larger_than_a_part_round_trip(store: ShardStore, tmp_path: Path) -> None:
    source = tmp_path / "segment"
    source.mkdir()
    big = bytes(range(256)) * ((PART_BYTES * 2 + 12345) // 256)
    (source / "big.bin").write_bytes(big)
    (source / "empty.bin").write_bytes(b"")
    published = PostgresLexicalPublication(store.pool, store.shard, schema=shard_schema(store.shard))
    upload = published.upload("gen_99", source)
    target = tmp_path / "fetched"
    target.mkdir()
    assert published.fetch("gen_99", target) == upload == published.upload_of("gen_99")
    assert (target / "big.bin").read_bytes() == big and (target / "empty.bin").read_bytes() == b""


class _CountingPublication(PostgresLexicalPublication):
    """Counts how often the follower asks this shard alone for its manifest."""

    asked = 0

    def manifest(self) -> ShardManifest | None:
        self.asked += 1
        return super().manifest()


def test_a_follower_reads_a_databases_shards_in_one_statement(store: ShardStore, tmp_path: Path) -> None:
    second = ShardStore(store.pool, 1, dimensions=DIM)  # a second shard in the same database
    second.ensure_schema()
    for shard, word in ((store, "otter"), (second, "heron")):
        shard.apply([_write(f"{word}-{i}.txt", 1, f"{word} {i}") for i in range(6)])
        assert _builder(tmp_path / "builder", shard).update()["kind"] == "merge"
    published = {s.shard: _CountingPublication(s.pool, s.shard, schema=shard_schema(s.shard)) for s in (store, second)}
    query_dir = tmp_path / "query"
    readers = manifest_readers([store, second])
    assert len(readers) == 1
    assert readers[0]() == {shard: p.manifest() for shard, p in published.items()}
    follower = IndexFollower([ShardMirror(query_dir, p) for p in published.values()], interval_s=0.05, readers=readers)
    for p in published.values():
        p.asked = 0
    follower.sync()
    assert follower.ready and _paths(query_dir, second, "heron") == {f"heron-{i}.txt" for i in range(6)}
    # A delta published meanwhile is read from the same statement (not from the last round's parse).
    second.apply([_write("late.txt", 1, "heron late")])
    assert _builder(tmp_path / "builder", second).update()["kind"] == "delta"
    follower.sync()
    assert "late.txt" in _paths(query_dir, second, "heron")
    # No shard was asked alone, except when installing (under the lock: is it still the one published?).
    assert [p.asked for p in published.values()] == [1, 2]


def test_a_follower_whose_database_read_fails_reads_each_shard_alone(store: ShardStore, tmp_path: Path) -> None:
    store.apply([_write(f"doc-{i}.txt", 1, f"puffin {i}") for i in range(5)])
    assert _builder(tmp_path / "builder", store).update()["kind"] == "merge"
    missing = ShardStore(store.pool, 7, dimensions=DIM)  # its schema was never created: the joint read fails
    mirrors = [_mirror(tmp_path / "query", s) for s in (store, missing)]
    follower = IndexFollower(mirrors, interval_s=0.05, readers=manifest_readers([store, missing]))
    with pytest.raises(SchemaMissingError):
        follower.sync()
    status = follower.status()["shards"]
    assert status[store.shard]["synced"] and status[store.shard]["installed"].startswith("gen_")
    assert not status[7]["synced"] and "lacks a table" in status[7]["error"]
    assert _paths(tmp_path / "query", store, "puffin") == {f"doc-{i}.txt" for i in range(5)}




class _CountingPool:
    """``pool``, recording the statements run on the connections it lends."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.statements = pool, list[str]()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

    @contextmanager
    def connection(self) -> Iterator[Any]:
        with self.pool.connection() as conn:
            original = conn.execute

            def execute(statement: Any, *args: Any, **kwargs: Any) -> Any:
                self.statements.append(statement if isinstance(statement, str) else statement.as_string(conn))
                return original(statement, *args, **kwargs)

            conn.execute = execute
            try:
                yield conn
            finally:
                del conn.execute


def test_a_shard_without_a_schema_is_left_out_of_the_joint_read_until_it_has_one(
        store: ShardStore, tmp_path: Path) -> None:
    store.apply([_write("doc.txt", 1, "grebe")])
    assert _builder(tmp_path / "builder", store).update()["kind"] == "merge"
    late = ShardStore(store.pool, 9, dimensions=DIM)  # no schema yet
    pool, now = _CountingPool(store.pool), [0.0]
    reads = PublishedManifests(cast(Any, pool), [store.shard, late.shard], recheck_s=5.0, clock=lambda: now[0])
    first = reads.read()  # the joint statement fails once; the shards with a table are read at once
    assert set(first) == {store.shard} and first[store.shard] is not None and reads.left_out == (late.shard,)
    assert len(pool.statements) == 3  # the joint read that failed, the tables looked up, the read of the rest
    pool.statements.clear()
    assert set(reads.read()) == {store.shard}  # before the recheck: one statement, naming only the shard it can
    assert len(pool.statements) == 1 and shard_schema(late.shard) not in pool.statements[0]
    late.ensure_schema()
    assert set(reads.read()) == {store.shard}  # not looked up again before recheck_s
    now[0] = 5.0
    assert reads.read() == {store.shard: first[store.shard], late.shard: None} and reads.left_out == ()
