from __future__ import annotations

import math
from pathlib import Path

import pytest

from shardfuse.pipeline.core.errors import PermanentError
from shardfuse.query.evaluation import load_beir, mrr_at_k, ndcg_at_k, percentile, recall_at_k
from tests.support.paths import SHARED_DATA

SHARED = SHARED_DATA


def test_ndcg_by_hand() -> None:
    qrels = {"a": 1, "b": 2, "z": 0}
    # ranked: x, b, a → DCG = 2/log2(3) + 1/log2(4); ideal: b, a → 2/log2(2) + 1/log2(3)
    expected = (2 / math.log2(3) + 1 / 2) / (2 + 1 / math.log2(3))
    assert ndcg_at_k(["x", "b", "a"], qrels, 10) == pytest.approx(expected)
    assert ndcg_at_k(["b", "a"], qrels, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["x", "b", "a"], qrels, 1) == 0.0
    assert ndcg_at_k(["z"], {"z": 0}, 10) == 0.0  # nothing relevant is judged


def test_recall_and_mrr_by_hand() -> None:
    qrels = {"a": 1, "b": 1, "c": 1, "z": 0}
    assert recall_at_k(["a", "x", "c", "z"], qrels, 100) == pytest.approx(2 / 3)
    assert recall_at_k(["a", "x", "c"], qrels, 1) == pytest.approx(1 / 3)
    assert mrr_at_k(["z", "x", "c"], qrels, 10) == pytest.approx(1 / 3)
    assert mrr_at_k(["z", "x", "c"], qrels, 2) == 0.0


def test_percentile_matches_linear_interpolation() -> None:
    values = [10.0, 20.0, 30.0, 40.0]
    assert percentile(values, 50) == pytest.approx(25.0)
    assert percentile(values, 95) == pytest.approx(38.5)
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_load_beir_tolerates_crlf_and_keeps_only_judged_queries(tmp_path: Path) -> None:
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "title": "T", "text": "body"}\n{"_id": "d2", "text": "x"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "first"}\n{"_id": "q2", "text": "unjudged"}\n')
    (tmp_path / "qrels" / "test.tsv").write_bytes(b"query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq1\td2\t0\r\n")
    data = load_beir(tmp_path)
    assert data.queries == {"q1": "first"} and data.qrels == {"q1": {"d1": 1, "d2": 0}}
    assert data.corpus[0].content == "T\n\nbody" and data.corpus[1].content == "x"
    with pytest.raises(PermanentError, match="missing"):
        load_beir(tmp_path, split="dev")


@pytest.mark.skipif(not (SHARED / "scifact").is_dir(), reason="shared data not present")
def test_scifact_loads_with_its_published_counts() -> None:
    data = load_beir(SHARED / "scifact")
    assert len(data.corpus) == 5183 and len(data.queries) == 300
    assert sum(len(judged) for judged in data.qrels.values()) == 339
