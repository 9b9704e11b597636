"""BM25 delta segments: masking, scoring consistent with a full build, publishing, merging."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fakeredis
import numpy as np
import pytest

from shardfuse.pipeline.index.lexical import LexicalShardReader, read_manifest
from shardfuse.pipeline.index.lexical.doc_keys import doc_key, doc_key_array, rows_of
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.stats import combine
from tests.unit.pipeline.index.lexical_fakes import MemoryShard, indexer

TEXTS = {
    "a.txt": "apple orchard harvest in autumn",
    "b.txt": "pear tree blossom in spring",
    "c.txt": "banana plantation harvest",
    "d.txt": "cherry orchard with old trees",
    "e.txt": "the quick brown fox jumps over the lazy dog",
}


def _shard() -> MemoryShard:
    shard = MemoryShard()
    for path, text in TEXTS.items():
        shard.write("z", path, text)
    shard.write("other", "x.txt", "apple pie recipe")
    return shard


def _scores(reader: LexicalShardReader, query: str, zone: str = "z") -> dict[str, float]:
    return {h.chunk_id.split("#")[0]: h.score for h in reader.search(query, zone=zone, k=10)}


def _built(root: Path, shard: MemoryShard, **options: Any) -> tuple[Bm25Freshness, Any]:
    """The shard's first full build under ``root``: its freshness record and the indexer that built it."""
    freshness = Bm25Freshness(fakeredis.FakeRedis())
    job = indexer(root, shard, freshness, **options)
    freshness.mark_dirty(0, [])
    job.update()
    return freshness, job


def _written(shard: MemoryShard, freshness: Bm25Freshness, path: str, text: str) -> None:
    """A committed write of ``path``: the shard holds it and the freshness record names it."""
    shard.write("z", path, text)
    freshness.mark_dirty(0, [("z", path)])


def test_doc_keys_find_rows_by_binary_search() -> None:
    keys = doc_key_array(["z", "z", "y", "z"], ["a", "b", "a", "a"])
    order = np.argsort(keys, kind="stable")
    assert rows_of(keys, order, [doc_key("z", "a")]).tolist() == [0, 3]
    assert rows_of(keys, order, [doc_key("y", "a"), doc_key("q", "q")]).tolist() == [2]
    assert rows_of(keys, order, []).tolist() == []


def test_first_update_merges_then_writes_go_to_a_delta(tmp_path: Path) -> None:
    shard = _shard()
    freshness = Bm25Freshness(fakeredis.FakeRedis())
    job = indexer(tmp_path, shard, freshness)
    freshness.mark_dirty(0, [("z", p) for p in TEXTS])
    assert job.update()["kind"] == "merge"
    reader = LexicalShardReader(tmp_path, 0)
    assert set(_scores(reader, "harvest")) == {"a.txt", "c.txt"}

    shard.write("z", "a.txt", "kiwi orchard")  # rewritten: its old rows must be masked
    shard.delete("z", "c.txt")  # deleted: no delta rows, base rows masked
    shard.write("z", "f.txt", "mango harvest festival")  # new
    freshness.mark_dirty(0, [("z", "a.txt"), ("z", "c.txt"), ("z", "f.txt")])
    result = job.update()
    assert result["kind"] == "delta" and result["delta_documents"] == 2
    manifest = read_manifest(tmp_path, 0)
    assert manifest is not None and manifest.delta and manifest.delta_masked == 2
    # The versions are the shard's (PostgreSQL's snapshots; here the fake's change counter), not Redis's.
    assert manifest.built_version == 9 and manifest.generation_version == 6 and manifest.tracks_postgres

    assert set(_scores(reader, "harvest")) == {"f.txt"}
    assert set(_scores(reader, "kiwi")) == {"a.txt"}
    assert _scores(reader, "apple") == {}  # a.txt's old text is masked; x.txt is another zone
    assert set(_scores(reader, "apple", zone="other")) == {"x.txt"}
    assert reader.search("kiwi", zone="other", k=5) == []  # the delta keeps zones apart
    assert job.update()["kind"] == "current"


def test_delta_scores_equal_a_full_build(tmp_path: Path) -> None:
    """Delta documents are scored with the base's average length and the live documents' IDF: a document
    re-indexed unchanged in the delta scores what it scored in the base, and the scores after a change
    match a full build of the same content (up to the average length, equal here)."""
    shard = _shard()
    freshness, job = _built(tmp_path / "inc", shard)
    reader = LexicalShardReader(tmp_path / "inc", 0)
    before = _scores(reader, "orchard harvest trees")
    shard.touch("z", "a.txt")  # written again, content unchanged
    shard.touch("z", "d.txt")
    freshness.mark_dirty(0, [("z", "a.txt"), ("z", "d.txt")])
    assert job.update()["kind"] == "delta"
    after = _scores(reader, "orchard harvest trees")
    assert after.keys() == before.keys()
    for path, score in before.items():
        assert after[path] == pytest.approx(score, rel=1e-5)

    # Swap a document for one of the same length: the average length is unchanged, so a full build of the
    # new content must give the same scores, with and without zone statistics.
    _written(shard, freshness, "b.txt", "orchard tree blossom in autumn")
    job.update()
    full = indexer(tmp_path / "full", shard)
    full.merge()
    full_reader = LexicalShardReader(tmp_path / "full", 0)
    for query in ("orchard harvest trees", "autumn blossom", "apple"):
        for zone in ("z", "other"):
            assert _scores(reader, query, zone) == pytest.approx(_scores(full_reader, query, zone), rel=1e-5)
            stats = combine([reader.term_stats(query, zone=zone)])
            full_stats = combine([full_reader.term_stats(query, zone=zone)])
            assert stats.docs == full_stats.docs
            assert {t: c for t, c in stats.df.items() if c} == {t: c for t, c in full_stats.df.items() if c}
            got = {h.chunk_id.split("#")[0]: h.score for h in reader.search(query, zone=zone, k=10, stats=stats)}
            want = {h.chunk_id.split("#")[0]: h.score
                    for h in full_reader.search(query, zone=zone, k=10, stats=full_stats)}
            assert got == pytest.approx(want, rel=1e-5)


def test_allowed_filter_applies_to_the_delta(tmp_path: Path) -> None:
    shard = _shard()
    freshness, job = _built(tmp_path, shard)
    _written(shard, freshness, "f.txt", "apple harvest festival")
    job.update()
    reader = LexicalShardReader(tmp_path, 0)
    new_id = shard.docs[("z", "f.txt")][0][0]
    assert [h.chunk_id for h in reader.search("harvest", zone="z", k=5, allowed={new_id})] == [new_id]
    base_id = shard.docs[("z", "c.txt")][0][0]
    assert [h.chunk_id for h in reader.search("harvest", zone="z", k=5, allowed={base_id})] == [base_id]


def test_merge_folds_the_delta_and_catches_up_on_writes_during_the_build(tmp_path: Path) -> None:
    shard = _shard()
    freshness, job = _built(tmp_path, shard)
    _written(shard, freshness, "f.txt", "mango harvest")
    job.update()

    real_rows = shard.all_rows

    def rows_then_write(store: object):  # type: ignore[no-untyped-def]
        rows = list(real_rows(store))  # the merge's snapshot ...
        shard.write("z", "g.txt", "papaya harvest")  # ... and a write committed during the build
        freshness.mark_dirty(0, [("z", "g.txt")])
        return rows

    job.all_rows = rows_then_write
    result = job.merge()
    manifest = read_manifest(tmp_path, 0)
    assert manifest is not None and result["kind"] == "merge"
    assert manifest.generation == 2 and manifest.generation_version == 7  # the snapshot before the rows
    assert manifest.built_version == 8 and manifest.delta and manifest.delta_docs == 1  # g.txt caught up
    reader = LexicalShardReader(tmp_path, 0)
    assert set(_scores(reader, "harvest")) == {"c.txt", "f.txt", "g.txt", "a.txt"}
    assert job.update()["kind"] == "current"  # nothing changed since the catch-up's snapshot


def test_merge_is_due_when_the_delta_grows(tmp_path: Path) -> None:
    shard = _shard()
    freshness, job = _built(tmp_path, shard, delta_max_chunks=1)
    _written(shard, freshness, "f.txt", "one")
    assert job.update()["merge_due"] is False
    _written(shard, freshness, "g.txt", "two")
    assert job.update()["merge_due"] is True


def test_a_generation_without_delta_files_falls_back_to_a_merge(tmp_path: Path) -> None:
    shard = _shard()
    freshness, job = _built(tmp_path, shard)
    generation = read_manifest(tmp_path, 0)
    assert generation is not None
    (tmp_path / "shard_0" / generation.directory / "lexical_stats.json").unlink()
    _written(shard, freshness, "a.txt", "kiwi")
    assert job.update()["kind"] == "merge"


def test_old_manifests_parse_and_readers_refuse_a_foreign_delta(tmp_path: Path) -> None:
    shard = _shard()
    freshness, job = _built(tmp_path, shard)
    path = tmp_path / "shard_0" / "MANIFEST.json"
    data = json.loads(path.read_text())
    for name in ("base_version", "delta", "delta_docs", "delta_masked", "delta_created_at", "built_snapshot"):
        data.pop(name)
    path.write_text(json.dumps(data))
    manifest = read_manifest(tmp_path, 0)
    assert manifest is not None and manifest.delta == "" and manifest.generation_version == manifest.built_version
    assert not manifest.tracks_postgres


def test_each_delta_builds_on_the_previous_one(tmp_path: Path) -> None:
    """Only documents written since the last delta are read again; the others keep their rows and scores."""
    shard = _shard()
    freshness = Bm25Freshness(fakeredis.FakeRedis())
    reads: list[list[tuple[str, str]]] = []
    real = shard.doc_rows

    def counting(store: object, keys):  # type: ignore[no-untyped-def]
        keys = sorted(keys)
        reads.append(keys)
        return real(store, keys)

    job = indexer(tmp_path, shard, freshness)
    job.doc_rows = counting
    freshness.mark_dirty(0, [])
    job.update()
    reader = LexicalShardReader(tmp_path, 0)
    shard.write("z", "f.txt", "mango harvest")
    shard.write("z", "g.txt", "papaya harvest festival")
    freshness.mark_dirty(0, [("z", "f.txt"), ("z", "g.txt")])
    job.update()
    g_score = _scores(reader, "festival")["g.txt"]

    shard.write("z", "f.txt", "guava grove")  # rewritten while in the delta
    freshness.mark_dirty(0, [("z", "f.txt")])
    assert job.update()["delta_documents"] == 2
    assert reads[-1] == [("z", "f.txt")]
    assert set(_scores(reader, "harvest")) == {"a.txt", "c.txt", "g.txt"}
    assert set(_scores(reader, "guava")) == {"f.txt"}
    assert _scores(reader, "festival")["g.txt"] == pytest.approx(g_score, rel=1e-6)

    shard.delete("z", "f.txt")
    shard.delete("z", "a.txt")
    freshness.mark_dirty(0, [("z", "f.txt"), ("z", "a.txt")])
    assert job.update()["delta_documents"] == 1
    assert _scores(reader, "guava") == {} and set(_scores(reader, "harvest")) == {"c.txt", "g.txt"}
    manifest = read_manifest(tmp_path, 0)
    assert manifest is not None and manifest.delta_masked == 1  # a.txt; f.txt never was in the generation


def test_equal_scores_in_the_delta_keep_the_lowest_chunk_ids(tmp_path: Path) -> None:
    shard = _shard()
    freshness, job = _built(tmp_path, shard)
    for n in (4, 0, 3, 1, 2):
        _written(shard, freshness, f"copy-{n}.txt", "walnut grove")
    assert job.update()["kind"] == "delta"

    hits = LexicalShardReader(tmp_path, 0).search("walnut", zone="z", k=2)

    assert [hit.chunk_id.split("#")[0] for hit in hits] == ["copy-0.txt", "copy-1.txt"]
