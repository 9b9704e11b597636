"""The shard manifest: JSON round trip, corrupt manifests, and atomic publishing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shardfuse.pipeline.core.errors import PermanentError
from shardfuse.pipeline.index.lexical import ShardManifest, build_shard_index, read_manifest
from shardfuse.pipeline.index.lexical.layout import manifest_path
from shardfuse.pipeline.index.lexical.manifest import read_manifest_text


def _manifest(**overrides: object) -> ShardManifest:
    fields: dict[str, object] = {
        "shard": 3,
        "generation": 7,
        "built_version": 41,
        "doc_count": 12,
        "directory": "gen_7",
        "created_at": 1700000000.25,
        "k1": 1.2,
        "b": 0.5,
        "vocab_size": 30,
    }
    fields.update(overrides)
    return ShardManifest(**fields)  # type: ignore[arg-type]


def test_json_round_trip() -> None:
    manifest = _manifest()
    assert ShardManifest.from_json(manifest.to_json()) == manifest


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"format": 1}',
        _manifest().to_json().replace('"format": 1', '"format": 99'),
        _manifest().to_json().replace('"generation": 7', '"generation": "7"'),
        _manifest().to_json().replace('"gen_7"', '"../elsewhere"'),
    ],
)
def test_from_json_rejects_invalid_manifests(text: str) -> None:
    with pytest.raises(ValueError):
        ShardManifest.from_json(text)


def test_read_manifest_is_none_before_any_build(tmp_path: Path) -> None:
    assert read_manifest(tmp_path, 0) is None


def test_read_manifest_returns_what_the_build_published(tmp_path: Path) -> None:
    published = build_shard_index(
        tmp_path, 2, chunk_ids=["c1"], zones=["z"], texts=["hello world"], built_version=5, k1=1.2, b=0.6
    )
    assert read_manifest(tmp_path, 2) == published
    assert (published.shard, published.generation, published.built_version) == (2, 1, 5)
    assert (published.doc_count, published.vocab_size, published.k1, published.b) == (1, 2, 1.2, 0.6)
    assert (tmp_path / "shard_2" / published.directory).is_dir()


def test_corrupt_manifest_is_a_permanent_error_naming_the_fix(tmp_path: Path) -> None:
    build_shard_index(tmp_path, 0, chunk_ids=["c1"], zones=["z"], texts=["hello"], built_version=1)
    manifest_path(tmp_path, 0).write_text("{not json", encoding="utf-8")
    with pytest.raises(PermanentError, match="rebuild shard 0"):
        read_manifest(tmp_path, 0)


def test_a_rebuild_replaces_a_corrupt_manifest(tmp_path: Path) -> None:
    build_shard_index(tmp_path, 0, chunk_ids=["c1"], zones=["z"], texts=["hello"], built_version=1)
    manifest_path(tmp_path, 0).write_text("{not json", encoding="utf-8")
    rebuilt = build_shard_index(tmp_path, 0, chunk_ids=["c1"], zones=["z"], texts=["hello"], built_version=2)
    # The generation is taken from the directories on disk when the manifest cannot be trusted.
    assert rebuilt.generation == 2
    assert read_manifest(tmp_path, 0) == rebuilt


def test_manifest_is_never_half_written_during_repeated_rebuilds(tmp_path: Path) -> None:
    texts = [f"document number {i} about topic{i % 7}" for i in range(300)]
    chunk_ids = [f"c{i}" for i in range(300)]
    zones = ["a" if i % 2 else "b" for i in range(300)]
    build_shard_index(tmp_path, 0, chunk_ids=chunk_ids, zones=zones, texts=texts, built_version=0)
    errors: list[BaseException] = []

    def rebuild() -> None:
        try:
            for version in range(1, 31):
                build_shard_index(tmp_path, 0, chunk_ids=chunk_ids, zones=zones, texts=texts, built_version=version)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=rebuild)
    thread.start()
    reads = 0
    seen: set[int] = set()
    while thread.is_alive() or reads == 0:
        manifest = read_manifest(tmp_path, 0)
        assert manifest is not None
        seen.add(manifest.generation)
        reads += 1
    thread.join()
    assert not errors
    assert len(seen) > 1
    final = read_manifest(tmp_path, 0)
    assert final is not None and final.generation == 31 and final.built_version == 30


def test_a_manifest_file_is_parsed_again_only_when_its_text_changed(tmp_path: Path) -> None:
    build_shard_index(tmp_path, 0, chunk_ids=["a"], zones=["z"], texts=["alpha"], built_version=1)
    first = read_manifest_text(tmp_path, 0)
    assert first is not None and first[1] == read_manifest(tmp_path, 0)
    assert read_manifest_text(tmp_path, 0, last=first) is first  # same text: the last parse
    build_shard_index(tmp_path, 0, chunk_ids=["a", "b"], zones=["z", "z"], texts=["alpha", "beta"], built_version=2)
    second = read_manifest_text(tmp_path, 0, last=first)
    assert second is not None and second[1].built_version == 2 and second[1] == read_manifest(tmp_path, 0)
    manifest_path(tmp_path, 0).unlink()
    assert read_manifest_text(tmp_path, 0, last=second) is None
