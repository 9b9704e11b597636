"""The query A/B's summary: differences are taken within a pair, never across pairs, and a bad revision is
refused before any stack starts."""

from __future__ import annotations

import pytest

from tests.benchmarks.query_ab import Run, main, same_top10, summarize


def _run(side: str, pair: int, p50: float, cpu: float, p99: float = 20.0) -> Run:
    return Run(side=side, pair=pair, p50_ms=p50, p99_ms=p99, cpu_ms_per_query=cpu)


def test_each_pair_is_compared_within_itself_so_drift_between_pairs_cancels() -> None:
    # The host slows down by 5 ms between the pairs; this side is 1 ms faster in both.
    runs = [_run("this", 1, 10.0, 7.0), _run("baseline", 1, 11.0, 8.0),
            _run("baseline", 2, 16.0, 8.5), _run("this", 2, 15.0, 7.0)]
    summary = summarize(runs)
    assert summary["pair_deltas"] == [{"p50_ms": -1.0, "cpu_ms_per_query": -1.0},
                                      {"p50_ms": -1.0, "cpu_ms_per_query": -1.5}]
    assert summary["median_delta_p50_ms"] == -1.0
    assert summary["median_delta_cpu_ms"] == -1.25
    assert summary["pairs_this_faster"] == 2
    assert summary["medians"]["this"]["p50_ms"] == 12.5
    assert summary["medians"]["baseline"]["p50_ms"] == 13.5


def test_a_pair_missing_a_side_is_not_counted_as_a_difference() -> None:
    summary = summarize([_run("this", 1, 10.0, 7.0), _run("baseline", 1, 9.0, 6.0), _run("this", 2, 8.0, 5.0)])
    assert summary["pairs"] == 1
    assert summary["pair_deltas"] == [{"p50_ms": 1.0, "cpu_ms_per_query": 1.0}]
    assert summary["pairs_this_faster"] == 0


def test_identical_top10s_are_counted_over_the_queries_both_sides_answered() -> None:
    this = {"a": ["1", "2"], "b": ["3", "4"], "c": ["5"]}
    baseline = {"a": ["1", "2"], "b": ["4", "3"], "d": ["6"]}
    assert same_top10(this, baseline) == (1, 2)


def test_a_revision_git_does_not_know_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["no-such-revision-anywhere"])
    assert exited.value.code == 2
    assert "'no-such-revision-anywhere' is not a revision" in capsys.readouterr().err
