"""The ingest A/B's summary: differences are taken within a pair, never across pairs, and a bad revision is
refused before any stack starts."""

from __future__ import annotations

import pytest

from tests.benchmarks.ingest_ab import Run, main, summarize


def _run(side: str, pair: int, rate: float, ingest_cpu: float = 20.0) -> Run:
    return Run(side=side, pair=pair, chunks_per_s=rate, cpu_s={"worker-ingest": ingest_cpu})


def test_each_pair_is_compared_within_itself_so_drift_between_pairs_cancels() -> None:
    # The host slows down by 100 chunks/s between the pairs; this side is 30 faster in both.
    runs = [_run("this", 1, 630.0, 19.0), _run("baseline", 1, 600.0, 21.0),
            _run("baseline", 2, 500.0, 22.0), _run("this", 2, 530.0, 20.0)]
    summary = summarize(runs)
    assert summary["pair_deltas_chunks_per_s"] == [30.0, 30.0]
    assert summary["median_delta_chunks_per_s"] == 30.0
    assert summary["pairs_this_faster"] == 2
    assert summary["medians"]["this"] == {"chunks_per_s": 580.0, "cpu_s": {"worker-ingest": 19.5}}
    assert summary["medians"]["baseline"]["chunks_per_s"] == 550.0


def test_a_pair_missing_a_side_is_not_counted_as_a_difference() -> None:
    summary = summarize([_run("this", 1, 500.0), _run("baseline", 1, 510.0), _run("this", 2, 700.0)])
    assert summary["pairs"] == 1 and summary["pair_deltas_chunks_per_s"] == [-10.0]
    assert summary["pairs_this_faster"] == 0


def test_a_revision_that_names_no_commit_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["no-such-revision-anywhere"])
    assert exited.value.code == 2
    assert "is not a revision" in capsys.readouterr().err
