"""Property: a masked search returns exactly the zone's best matches that an unmasked bm25s ranks."""

from __future__ import annotations

import tempfile
from pathlib import Path

import bm25s
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.index.lexical import LexicalShardReader, Tokenizer, build_shard_index

tokenize = Tokenizer()

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "zeta", "the", "x"]
ZONES = ["a", "b", "c"]

documents = st.lists(
    st.tuples(st.sampled_from(ZONES), st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join)),
    max_size=25,
)
queries = st.lists(st.sampled_from([*WORDS, "unknownword"]), min_size=1, max_size=3).map(" ".join)


def _brute_force(texts: list[str], zones: list[str], query: str, zone: str) -> list[tuple[float, str]]:
    """Every document of ``zone`` with a positive score, best first, scored by bm25s without a mask."""
    corpus = [tokenize(text) for text in texts]
    if not any(corpus):
        return []
    retriever = bm25s.BM25(method="lucene")
    retriever.index(corpus, show_progress=False)
    known = [token for token in tokenize(query) if token in retriever.vocab_dict]
    if not known:
        return []
    scores = np.asarray(retriever.get_scores(known))
    ranked = [(float(scores[i]), f"c{i}") for i in range(len(texts)) if zones[i] == zone and scores[i] > 0]
    return sorted(ranked, key=lambda pair: (-pair[0], pair[1]))


@settings(max_examples=75, deadline=None)
@given(docs=documents, query=queries, zone=st.sampled_from(ZONES), k=st.integers(min_value=1, max_value=30))
def test_masked_top_k_equals_zone_filtered_brute_force(
    docs: list[tuple[str, str]], query: str, zone: str, k: int
) -> None:
    zones = [z for z, _ in docs]
    texts = [text for _, text in docs]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_shard_index(
            root, 0, chunk_ids=[f"c{i}" for i in range(len(docs))], zones=zones, texts=texts, built_version=1
        )
        hits = LexicalShardReader(root, 0).search(query, zone=zone, k=k)

    expected = _brute_force(texts, zones, query, zone)
    in_zone = {f"c{i}" for i, z in enumerate(zones) if z == zone}

    assert all(hit.chunk_id in in_zone and hit.score > 0 for hit in hits)
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)
    assert len(hits) == min(k, len(expected))
    # Same scores, in the same order, as the brute-force top k.
    np.testing.assert_allclose([hit.score for hit in hits], [s for s, _ in expected[: len(hits)]], rtol=1e-6)
    if hits:
        # Same documents, modulo ties at the cut: everything clearly above the k-th score must match. "Clearly":
        # beyond the float32 rounding the index scores with (the brute force is float64), or a document tied
        # with the cut could count as above it on one side only.
        cut = hits[-1].score * (1 + 1e-6)
        assert {h.chunk_id for h in hits if h.score > cut} == {c for s, c in expected if s > cut}
    if k >= len(expected):
        assert {hit.chunk_id for hit in hits} == {c for _, c in expected}
