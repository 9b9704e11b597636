"""Build a shard's BM25 index, then search it: relevance, zone masks and edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardfuse.pipeline.core.errors import InvalidQueryError, StoreUnavailableError
from shardfuse.pipeline.index.lexical import (
    LexicalHit,
    LexicalShardReader,
    ShardManifest,
    Tokenizer,
    build_shard_index,
)
from shardfuse.pipeline.index.lexical.layout import manifest_path


def _build(root: Path, docs: dict[str, tuple[str, str]], *, shard: int = 0, version: int = 1) -> ShardManifest:
    """Build ``shard`` from ``{chunk_id: (zone, text)}``."""
    return build_shard_index(
        root,
        shard,
        chunk_ids=list(docs),
        zones=[zone for zone, _ in docs.values()],
        texts=[text for _, text in docs.values()],
        built_version=version,
    )


DOCS = {
    "c-parse": ("acme", "def parse_config(path): load the TOML configuration file"),
    "c-render": ("acme", "render the HTML template with jinja"),
    "c-retry": ("acme", "retry the HTTP request with exponential backoff"),
    "c-other": ("globex", "parse the configuration of another tenant"),
}


def test_finds_the_matching_chunk(tmp_path: Path) -> None:
    manifest = _build(tmp_path, DOCS)
    reader = LexicalShardReader(tmp_path, 0)
    assert reader.generation is None  # lazy: nothing is loaded before the first search

    hits = reader.search("exponential backoff", zone="acme", k=5)

    assert [hit.chunk_id for hit in hits] == ["c-retry"]
    assert isinstance(hits[0], LexicalHit) and hits[0].score > 0
    assert reader.generation == manifest.generation == 1
    assert reader.manifest == manifest


def test_hits_are_best_first_with_positive_scores(tmp_path: Path) -> None:
    _build(tmp_path, DOCS)
    hits = LexicalShardReader(tmp_path, 0).search("configuration template", zone="acme", k=10)
    assert {hit.chunk_id for hit in hits} == {"c-parse", "c-render"}
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)
    assert all(hit.score > 0 for hit in hits)


def test_zone_gets_its_own_k_hits_however_many_better_matches_other_zones_hold(tmp_path: Path) -> None:
    docs: dict[str, tuple[str, str]] = {}
    # Zone "b": 100 short documents that say "kafka" three times: each outscores every zone-"a" document.
    for i in range(100):
        docs[f"b{i}"] = ("b", "kafka kafka kafka")
    # Zone "a": 15 long documents that mention "kafka" once.
    for i in range(15):
        docs[f"a{i}"] = ("a", f"kafka consumer group rebalancing notes number{i} with many more filler words")
    for i in range(50):
        docs[f"n{i}"] = ("a", f"unrelated zookeeper text {i}")
    _build(tmp_path, docs)
    reader = LexicalShardReader(tmp_path, 0)

    a_hits = reader.search("kafka", zone="a", k=10)
    b_hits = reader.search("kafka", zone="b", k=10)

    assert len(a_hits) == 10
    assert all(hit.chunk_id.startswith("a") for hit in a_hits)
    assert min(hit.score for hit in b_hits) > max(hit.score for hit in a_hits)  # "b" really is stronger
    all_a = reader.search("kafka", zone="a", k=1000)
    assert {hit.chunk_id for hit in all_a} == {f"a{i}" for i in range(15)}
    assert all(hit.chunk_id.startswith("b") for hit in reader.search("kafka", zone="b", k=1000))


def test_unknown_zone_returns_nothing(tmp_path: Path) -> None:
    _build(tmp_path, DOCS)
    assert LexicalShardReader(tmp_path, 0).search("configuration", zone="initech", k=10) == []


def test_k_larger_than_the_shard_is_clamped(tmp_path: Path) -> None:
    _build(tmp_path, DOCS)
    hits = LexicalShardReader(tmp_path, 0).search("configuration", zone="globex", k=10_000)
    assert [hit.chunk_id for hit in hits] == ["c-other"]


def test_k_below_one_is_an_invalid_query(tmp_path: Path) -> None:
    _build(tmp_path, DOCS)
    with pytest.raises(InvalidQueryError):
        LexicalShardReader(tmp_path, 0).search("configuration", zone="acme", k=0)


def test_unknown_query_tokens_are_ignored(tmp_path: Path) -> None:
    _build(tmp_path, DOCS)
    reader = LexicalShardReader(tmp_path, 0)
    hits = reader.search("zyzzyva jinja quuxplatz", zone="acme", k=5)
    assert [hit.chunk_id for hit in hits] == ["c-render"]
    assert reader.search("zyzzyva quuxplatz", zone="acme", k=5) == []


def test_query_without_tokens_returns_nothing(tmp_path: Path) -> None:
    _build(tmp_path, DOCS)
    reader = LexicalShardReader(tmp_path, 0)
    assert reader.search("", zone="acme", k=5) == []
    assert reader.search("the a of ?!", zone="acme", k=5) == []


def test_empty_shard_publishes_a_manifest_and_returns_nothing(tmp_path: Path) -> None:
    manifest = _build(tmp_path, {})
    assert (manifest.doc_count, manifest.vocab_size, manifest.generation) == (0, 0, 1)
    assert list((tmp_path / "shard_0" / manifest.directory).iterdir()) == []
    reader = LexicalShardReader(tmp_path, 0)
    assert reader.search("anything at all", zone="acme", k=10) == []
    assert reader.generation == 1


def test_shard_never_built_returns_nothing(tmp_path: Path) -> None:
    reader = LexicalShardReader(tmp_path, 4)
    assert reader.search("configuration", zone="acme", k=10) == []
    assert reader.generation is None and reader.manifest is None


def test_chunks_without_tokens_keep_ids_aligned(tmp_path: Path) -> None:
    docs = {
        "empty-1": ("acme", ""),
        "punct": ("acme", "... --- !!!"),
        "stop": ("acme", "the a of it"),
        "hit": ("acme", "postgres vacuum tuning"),
        "empty-2": ("acme", "   "),
        "other": ("acme", "redis eviction policy"),
    }
    manifest = _build(tmp_path, docs)
    assert manifest.doc_count == 6
    reader = LexicalShardReader(tmp_path, 0)
    assert [hit.chunk_id for hit in reader.search("vacuum", zone="acme", k=10)] == ["hit"]
    assert [hit.chunk_id for hit in reader.search("eviction", zone="acme", k=10)] == ["other"]


def test_shard_where_no_chunk_has_a_token(tmp_path: Path) -> None:
    manifest = _build(tmp_path, {"x": ("acme", "the a"), "y": ("acme", "!!")})
    assert (manifest.doc_count, manifest.vocab_size) == (2, 0)
    assert LexicalShardReader(tmp_path, 0).search("anything", zone="acme", k=3) == []


def test_bm25s_prints_nothing(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _build(tmp_path, DOCS)
    LexicalShardReader(tmp_path, 0).search("configuration", zone="acme", k=3)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_index_built_by_another_tokenizer_is_never_searched(tmp_path: Path) -> None:
    _build(tmp_path, DOCS)
    assert LexicalShardReader(tmp_path, 0).search("configuration", zone="acme", k=3)
    path = manifest_path(tmp_path, 0)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["tokenizer"] = "code-aware-v9"
    path.write_text(json.dumps(data), encoding="utf-8")
    reader = LexicalShardReader(tmp_path, 0)
    assert reader.search("configuration", zone="acme", k=3) == []
    assert reader.generation is None
    # an index built with stemming is not searched by a reader without it, and the other way round
    _build(tmp_path, DOCS)
    assert LexicalShardReader(tmp_path, 0, tokenizer=Tokenizer(stem=False)).search(
        "configuration", zone="acme", k=3) == []


def test_manifest_naming_a_missing_generation_is_transient(tmp_path: Path) -> None:
    manifest = _build(tmp_path, DOCS)
    path = manifest_path(tmp_path, 0)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["directory"] = "gen_99"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert manifest.directory != "gen_99"
    with pytest.raises(StoreUnavailableError):
        LexicalShardReader(tmp_path, 0).search("configuration", zone="acme", k=3)


def test_mismatched_input_lengths_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        build_shard_index(tmp_path, 0, chunk_ids=["a", "b"], zones=["z"], texts=["x", "y"], built_version=1)


def test_mask_cache_smaller_than_one_mask_still_serves_every_zone(tmp_path: Path) -> None:
    docs = {f"{zone}{i}": (zone, f"shared term {zone}") for zone in "abcde" for i in range(3)}
    _build(tmp_path, docs)
    reader = LexicalShardReader(tmp_path, 0, mask_cache_bytes=1)
    for _ in range(2):
        for zone in "abcde":
            hits = reader.search("shared", zone=zone, k=10)
            assert {hit.chunk_id for hit in hits} == {f"{zone}{i}" for i in range(3)}


def test_allowed_ids_narrow_the_mask_before_the_top_k_cut(tmp_path: Path) -> None:
    ids = [f"c{i:03d}" for i in range(200)]
    # every chunk matches; the stronger matches (more repetitions) are the ones the filter excludes
    texts = [("needle " * (5 if i < 190 else 1)) + f"filler{i}" for i in range(200)]
    build_shard_index(tmp_path, 0, chunk_ids=ids, zones=["z"] * 200, texts=texts, built_version=1)
    reader = LexicalShardReader(tmp_path, 0)
    allowed = frozenset(ids[190:]) | {"not-in-this-generation"}
    hits = reader.search("needle", zone="z", k=5, allowed=allowed)
    assert len(hits) == 5 and {h.chunk_id for h in hits} <= allowed  # a post-filter of the top 5 finds none
    assert reader.search("needle", zone="z", k=5, allowed=frozenset()) == []
    assert reader.search("needle", zone="other", k=5, allowed=allowed) == []


def test_equal_scores_at_the_cut_keep_the_lowest_chunk_ids(tmp_path: Path) -> None:
    # Twelve copies of one text score alike; which of them make the top 3 must not depend on where the
    # build put them, or repeated queries over the same corpus would fuse differently.
    # Non-matching chunks first: most of a shard scores zero, and only the scoring positions are ranked.
    docs = {f"other-{n:02d}": ("acme", f"unrelated text number {n}") for n in range(20)}
    ids = [f"copy-{n:02d}" for n in (7, 3, 11, 0, 9, 5, 1, 10, 2, 8, 6, 4)]
    docs |= {chunk_id: ("acme", "kafka consumer lag") for chunk_id in ids}
    docs["best"] = ("acme", "kafka kafka consumer lag")
    _build(tmp_path, docs)

    hits = LexicalShardReader(tmp_path, 0).search("kafka lag", zone="acme", k=4)

    assert [hit.chunk_id for hit in hits] == ["best", "copy-00", "copy-01", "copy-02"]
    assert hits[1].score == hits[2].score == hits[3].score < hits[0].score
