"""Zone-wide term statistics: BM25 scores that do not depend on shard count or on other zones."""

from __future__ import annotations

import math
import random
from pathlib import Path

import bm25s
import pytest

from shardfuse.pipeline.index.lexical import LexicalShardReader, Tokenizer, build_shard_index
from shardfuse.pipeline.index.lexical.stats import TermStats, combine, lucene_idf

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega"]


def _corpus(n: int, *, seed: int, length: int = 8) -> list[str]:
    rng = random.Random(seed)
    # Equal lengths keep every shard's average document length equal, so only the IDF can differ.
    return [" ".join(rng.choice(WORDS) for _ in range(length)) for _ in range(n)]


def _build(root: Path, shard: int, docs: list[tuple[str, str, str]]) -> LexicalShardReader:
    build_shard_index(root, shard, chunk_ids=[d[0] for d in docs], zones=[d[1] for d in docs],
                      texts=[d[2] for d in docs], built_version=1)
    return LexicalShardReader(root, shard)


def _search_all(readers: list[LexicalShardReader], query: str, zone: str, k: int) -> dict[str, float]:
    stats = combine(r.term_stats(query, zone=zone) for r in readers)
    hits = [h for r in readers for h in r.search(query, zone=zone, k=k, stats=stats)]
    return {h.chunk_id: h.score for h in hits}


def test_lucene_idf_matches_bm25s() -> None:
    from bm25s.scoring import _score_idf_lucene

    for df, docs in [(1, 10), (5, 10), (10, 10), (3, 1000)]:
        assert lucene_idf(df, docs) == pytest.approx(_score_idf_lucene(df, docs))


def test_combine_sums_documents_and_frequencies() -> None:
    total = combine([TermStats(3, {"a": 1, "b": 2}), TermStats(4, {"a": 2}), TermStats()])
    assert total.docs == 7 and dict(total.df) == {"a": 3, "b": 2}
    assert total.idf("missing") == pytest.approx(math.log(1 + 7.5 / 0.5))


def test_without_stats_scores_equal_bm25s_own(tmp_path: Path) -> None:
    texts = _corpus(60, seed=1)
    reader = _build(tmp_path, 0, [(f"c{i}", "z", t) for i, t in enumerate(texts)])
    ours = {h.chunk_id: h.score for h in reader.search("alpha gamma gamma", zone="z", k=60)}

    tokenizer = Tokenizer()
    retriever = bm25s.BM25(method="lucene")
    retriever.index([tokenizer(t) for t in texts], show_progress=False)
    docs, scores = retriever.retrieve([tokenizer("alpha gamma gamma")], k=60, show_progress=False)
    theirs = {f"c{d}": float(s) for d, s in zip(docs[0], scores[0], strict=True) if s > 0}
    assert ours.keys() == theirs.keys()
    for chunk_id, score in theirs.items():
        assert ours[chunk_id] == pytest.approx(score, rel=1e-5)


def test_one_shard_and_four_shards_score_alike(tmp_path: Path) -> None:
    texts = _corpus(200, seed=2)
    docs = [(f"c{i}", "z", t) for i, t in enumerate(texts)]
    one = _build(tmp_path / "one", 0, docs)
    four = [_build(tmp_path / "four", s, docs[s::4]) for s in range(4)]
    for query in ["alpha", "beta omega", "kappa kappa lambda theta"]:
        single = {h.chunk_id: h.score for h in one.search(query, zone="z", k=200)}
        spread = _search_all(four, query, "z", 200)
        assert spread.keys() == single.keys()
        for chunk_id, score in single.items():
            assert spread[chunk_id] == pytest.approx(score, rel=1e-4)


def test_another_zone_in_the_shard_does_not_change_a_zones_scores(tmp_path: Path) -> None:
    mine = [(f"m{i}", "mine", t) for i, t in enumerate(_corpus(50, seed=3))]
    # The other zone uses "alpha" in every document, which would make it look like a stopword shard-wide.
    theirs = [(f"t{i}", "theirs", "alpha " * 8) for i in range(500)]
    alone = _build(tmp_path / "alone", 0, mine)
    shared = _build(tmp_path / "shared", 0, mine + theirs)
    # The shared shard's average length changes only slightly (8 tokens everywhere); IDFs would change a lot.
    expected = {h.chunk_id: h.score for h in alone.search("alpha beta", zone="mine", k=50)}
    got = _search_all([shared], "alpha beta", "mine", 50)
    assert got.keys() == expected.keys()
    for chunk_id, score in expected.items():
        assert got[chunk_id] == pytest.approx(score, rel=1e-4)
    raw = {h.chunk_id: h.score for h in shared.search("alpha beta", zone="mine", k=50)}
    assert any(abs(raw[c] - s) > 0.05 * s for c, s in expected.items())  # without stats they differ


def test_stats_of_unknown_zone_or_tokens_are_empty(tmp_path: Path) -> None:
    reader = _build(tmp_path, 0, [("a", "z", "alpha beta")])
    assert reader.term_stats("alpha", zone="nowhere") == TermStats()
    assert reader.term_stats("unseen", zone="z") == TermStats(docs=1, df={})
    assert reader.term_stats("alpha alpha", zone="z").df == {"alpha": 1}
