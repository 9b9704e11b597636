"""BM25 coverage follows the shard's own record of what changed, whatever Redis lost or was never told: a
commit whose bookkeeping never ran, a flushed Redis, a manifest from when versions came from Redis."""

from __future__ import annotations

import json
from pathlib import Path

import fakeredis

from shardfuse.pipeline.index.lexical import LexicalShardReader, build_shard_index, read_manifest
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from tests.unit.pipeline.index.lexical_fakes import MemoryShard, indexer


def _found(root: Path, word: str, zone: str = "z") -> set[str]:
    return {h.chunk_id.split("#")[0] for h in LexicalShardReader(root, 0).search(word, zone=zone, k=50)}


def word(i: int) -> str:
    """A word only document ``i`` holds (letters only: the tokenizer splits digits off)."""
    return "mark" + "".join("bcdfghjklm"[int(d)] for d in f"{i:03d}")


def _shard(count: int = 5) -> MemoryShard:
    shard = MemoryShard()
    for i in range(count):
        shard.write("z", f"doc-{i}.txt", f"common text of document {word(i)}")
    return shard


def test_a_commit_whose_bookkeeping_was_lost_is_indexed_by_the_next_update(tmp_path: Path) -> None:
    shard = _shard()
    freshness = Bm25Freshness(fakeredis.FakeRedis())
    job = indexer(tmp_path, shard, freshness)
    assert job.update()["kind"] == "merge"
    shard.write("z", "lost.txt", "zanzibar")  # committed; the worker died before mark_dirty
    shard.write("z", "marked.txt", "quokka")
    freshness.mark_dirty(0, [("z", "marked.txt")])  # a later commit, marked: its update runs
    result = job.update()
    assert result["kind"] == "delta" and _found(tmp_path, "zanzibar") == {"lost.txt"}
    assert _found(tmp_path, "quokka") == {"marked.txt"}
    assert job.update()["kind"] == "current"


def test_every_committed_document_is_searchable_after_redis_is_flushed(tmp_path: Path) -> None:
    shard = _shard()
    client = fakeredis.FakeRedis()
    freshness = Bm25Freshness(client)
    job = indexer(tmp_path, shard, freshness)
    job.update()
    written = [f"late-{i}.txt" for i in range(20)]
    for i, path in enumerate(written):
        shard.write("z", path, f"kookaburra {word(100 + i)}")
        freshness.mark_dirty(0, [("z", path)])
    job.update()  # a delta with all twenty
    for path in written[:5]:
        shard.write("z", path, "wombat")  # rewritten ...
    shard.delete("z", written[5])  # ... and deleted
    client.flushall()  # ... and then Redis lost everything: the write versions went back to nothing
    assert freshness.dirty_version(0) == 0
    assert job.update()["kind"] == "delta"
    assert _found(tmp_path, "wombat") == set(written[:5])
    assert _found(tmp_path, "kookaburra") == set(written[6:])
    for i in range(100, 120):  # every document's own word: exactly the live ones
        assert _found(tmp_path, word(i)) == ({f"late-{i - 100}.txt"} if i - 100 >= 6 else set())
    assert _found(tmp_path, word(3)) == {"doc-3.txt"}


def test_a_manifest_from_redis_counter_versions_is_not_trusted_but_merged(tmp_path: Path) -> None:
    """A generation published when versions were Redis's counter may miss documents written at versions
    the counter lost: the update rebuilds it whole, even though its counter version is higher."""
    shard = _shard()
    # What the old scheme published: a generation that lacks doc-4 at a counter version far ahead.
    rows = [r for r in shard.all_rows(None) if not r[2].startswith("doc-4")]
    build_shard_index(tmp_path, 0, chunk_ids=[r[0] for r in rows], zones=[r[1] for r in rows],
                      texts=[r[3] for r in rows], paths=[r[2] for r in rows], built_version=10_000)
    old = read_manifest(tmp_path, 0)
    assert old is not None and not old.tracks_postgres
    assert _found(tmp_path, word(4)) == set()

    result = indexer(tmp_path, shard).update()
    assert result["kind"] == "merge"
    manifest = read_manifest(tmp_path, 0)
    assert manifest is not None and manifest.tracks_postgres and manifest.generation == old.generation + 1
    assert _found(tmp_path, word(4)) == {"doc-4.txt"}


def test_a_manifest_file_written_before_snapshots_reads_as_untracked(tmp_path: Path) -> None:
    shard = _shard()
    indexer(tmp_path, shard).update()
    path = tmp_path / "shard_0" / "MANIFEST.json"
    data = json.loads(path.read_text())
    assert data["built_snapshot"]
    del data["built_snapshot"]
    path.write_text(json.dumps(data))
    manifest = read_manifest(tmp_path, 0)
    assert manifest is not None and not manifest.tracks_postgres
    shard.write("z", "new.txt", "platypus")
    assert indexer(tmp_path, shard).update()["kind"] == "merge"
    assert _found(tmp_path, "platypus") == {"new.txt"}


def test_a_database_restored_into_another_cluster_gets_a_full_rebuild(tmp_path: Path) -> None:
    """Transaction ids restart lower in a new cluster: writes there look older than the index. The update
    notices (the database's version is below the published one) and the merge publishes over it."""
    shard = _shard()
    job = indexer(tmp_path, shard)
    job.update()
    for i in range(5, 40):
        shard.write("z", f"doc-{i}.txt", f"more text {word(i)}")
    job.update()
    before = read_manifest(tmp_path, 0)
    assert before is not None and before.built_version == 40
    shard._seq = 3  # restored into a new cluster: its ids count from lower down
    shard.write("z", "after-restore.txt", "bandicoot")
    result = job.update()
    assert result["kind"] == "merge"
    after = read_manifest(tmp_path, 0)
    assert after is not None and after.generation > before.generation and after.built_version == 4
    assert _found(tmp_path, "bandicoot") == {"after-restore.txt"}
    shard.write("z", "next.txt", "wallaroo")
    assert job.update()["kind"] == "delta" and _found(tmp_path, "wallaroo") == {"next.txt"}
