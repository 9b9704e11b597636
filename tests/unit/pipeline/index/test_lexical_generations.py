"""Publishing new generations: readers follow them, old ones are collected, builders do not collide."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from shardfuse.pipeline.index.lexical import LexicalShardReader, build_shard_index, read_manifest


def _build(root: Path, texts: list[str], *, version: int, keep: int = 2, zone: str = "z") -> int:
    manifest = build_shard_index(
        root,
        0,
        chunk_ids=[f"v{version}-{i}" for i in range(len(texts))],
        zones=[zone] * len(texts),
        texts=texts,
        built_version=version,
        keep_generations=keep,
    )
    return manifest.generation


def _generation_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "shard_0").iterdir() if p.name.startswith("gen_"))


def test_reader_follows_a_new_generation_without_being_recreated(tmp_path: Path) -> None:
    _build(tmp_path, ["apple orchard harvest", "pear tree"], version=1)
    reader = LexicalShardReader(tmp_path, 0)
    assert [h.chunk_id for h in reader.search("apple", zone="z", k=5)] == ["v1-0"]
    assert reader.generation == 1

    _build(tmp_path, ["banana plantation", "pear tree"], version=2)

    assert [h.chunk_id for h in reader.search("banana", zone="z", k=5)] == ["v2-0"]
    assert reader.search("apple", zone="z", k=5) == []
    assert reader.generation == 2


def test_reader_keeps_its_generation_while_the_manifest_is_unchanged(tmp_path: Path) -> None:
    _build(tmp_path, ["apple"], version=1)
    reader = LexicalShardReader(tmp_path, 0)
    reader.search("apple", zone="z", k=1)
    loaded = reader._state  # the cached generation object must be reused
    for _ in range(5):
        reader.search("apple", zone="z", k=1)
    assert reader._state is loaded


def test_refresh_loads_eagerly(tmp_path: Path) -> None:
    _build(tmp_path, ["apple"], version=1)
    reader = LexicalShardReader(tmp_path, 0)
    manifest = reader.refresh()
    assert manifest is not None and reader.generation == manifest.generation == 1


def test_generations_beyond_keep_are_collected(tmp_path: Path) -> None:
    for version in range(1, 6):
        _build(tmp_path, [f"text number {version}"], version=version, keep=2)
    assert _generation_dirs(tmp_path) == ["gen_4", "gen_5"]
    _build(tmp_path, ["final text"], version=6, keep=1)
    assert _generation_dirs(tmp_path) == ["gen_6"]
    manifest = read_manifest(tmp_path, 0)
    assert manifest is not None and manifest.directory == "gen_6"


def test_leftovers_of_crashed_builders_are_collected_once_stale(tmp_path: Path) -> None:
    _build(tmp_path, ["first"], version=1)
    shard = tmp_path / "shard_0"
    stale = shard / ".staging-crashed"
    stale.mkdir()
    fresh = shard / ".staging-running"
    fresh.mkdir()
    old = time.time() - 3 * 24 * 3600
    os.utime(stale, (old, old))
    _build(tmp_path, ["second"], version=2)
    assert not stale.exists()
    assert fresh.exists()  # may belong to a build still in progress


def test_reader_survives_its_generation_being_collected(tmp_path: Path) -> None:
    _build(tmp_path, ["apple"], version=1, keep=1)
    reader = LexicalShardReader(tmp_path, 0)
    assert len(reader.search("apple", zone="z", k=1)) == 1
    _build(tmp_path, ["apple banana"], version=2, keep=1)
    _build(tmp_path, ["banana cherry"], version=3, keep=1)
    assert _generation_dirs(tmp_path) == ["gen_3"]
    assert [h.chunk_id for h in reader.search("cherry", zone="z", k=1)] == ["v3-0"]


def test_an_older_build_never_replaces_a_newer_one(tmp_path: Path) -> None:
    assert _build(tmp_path, ["newer content"], version=10) == 1
    stale = build_shard_index(tmp_path, 0, chunk_ids=["old"], zones=["z"], texts=["older content"], built_version=9)
    assert stale.built_version == 10 and stale.generation == 1
    assert _generation_dirs(tmp_path) == ["gen_1"]
    assert not [p for p in (tmp_path / "shard_0").iterdir() if p.name.startswith(".staging-")]


def test_concurrent_builders_publish_distinct_generations(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    published: list[int] = []
    lock = threading.Lock()

    def builder(worker: int) -> None:
        try:
            for round_ in range(5):
                manifest = build_shard_index(
                    tmp_path,
                    0,
                    chunk_ids=[f"w{worker}-{round_}"],
                    zones=["z"],
                    texts=[f"worker{worker} round{round_}"],
                    built_version=0,
                    keep_generations=3,
                )
                with lock:
                    published.append(manifest.generation)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=builder, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors
    assert sorted(published) == list(range(1, 21))
    final = read_manifest(tmp_path, 0)
    assert final is not None and final.generation == 20
    assert _generation_dirs(tmp_path) == ["gen_18", "gen_19", "gen_20"]
    reader = LexicalShardReader(tmp_path, 0)
    assert len(reader.search("worker0 worker1 worker2 worker3", zone="z", k=5)) == 1


def test_searches_from_many_threads_during_rebuilds(tmp_path: Path) -> None:
    def texts(version: int) -> list[str]:
        return [f"common generation{version} doc{i}" for i in range(200)]

    _build(tmp_path, texts(0), version=0, keep=2)
    reader = LexicalShardReader(tmp_path, 0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def search() -> None:
        try:
            while not stop.is_set():
                hits = reader.search("common", zone="z", k=7)
                assert len(hits) == 7
                # Every hit of one search comes from one generation.
                assert len({hit.chunk_id.split("-")[0] for hit in hits}) == 1
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=search) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for version in range(1, 16):
            _build(tmp_path, texts(version), version=version, keep=2)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors
    assert reader.search("generation15", zone="z", k=1)[0].chunk_id.startswith("v15-")
    assert reader.generation == 16


def test_reader_loads_a_rebuild_that_reuses_a_lost_generation_number(tmp_path: Path) -> None:
    # `shardfuse rebuild-bm25` after the shard's folder was lost numbers generations from 1 again: the reader
    # must load the rebuilt files, not keep the arrays it mapped from the deleted folder of the same name.
    assert _build(tmp_path, ["apple orchard"], version=1) == 1
    reader = LexicalShardReader(tmp_path, 0)
    assert [h.chunk_id for h in reader.search("apple", zone="z", k=5)] == ["v1-0"]
    shutil.rmtree(tmp_path / "shard_0")

    assert _build(tmp_path, ["banana plantation"], version=2) == 1

    assert [h.chunk_id for h in reader.search("banana", zone="z", k=5)] == ["v2-0"]
    assert reader.search("apple", zone="z", k=5) == []
