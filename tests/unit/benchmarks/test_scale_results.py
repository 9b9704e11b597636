"""The scale benchmark's plain helpers: the sizes it runs, its results file, /proc status fields, pairing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scale_results import (
    DEFAULT_SIZES,
    paired_order,
    parse_sizes,
    pool_memory,
    read_results,
    results_path,
    status_fields,
    write_results,
)


def test_sizes_are_read_in_any_order_with_suffixes_and_default_when_unset() -> None:
    assert parse_sizes("1000000, 10000,100000") == [10_000, 100_000, 1_000_000]
    assert parse_sizes("10k,1M,10_000") == [10_000, 1_000_000]
    assert parse_sizes(None) == parse_sizes("  ") == list(DEFAULT_SIZES)


@pytest.mark.parametrize("text", ["10000,", "ten", "-5", "0", "1.5k", "10kk"])
def test_a_size_that_is_not_a_positive_number_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="SHARDFUSE_SCALE_SIZES"):
        parse_sizes(text)


def test_results_path_comes_from_the_environment_or_the_docs_figures() -> None:
    assert results_path({"SHARDFUSE_SCALE_RESULTS": "/tmp/x.json"}) == Path("/tmp/x.json")
    assert results_path({}).parts[-3:] == ("docs", "figures", "scale.json")


def test_results_are_merged_by_size_across_runs(tmp_path: Path) -> None:
    path = tmp_path / "figures" / "scale.json"
    write_results(path, [{"chunks_target": 100_000, "run": "a"}, {"chunks_target": 10_000, "run": "a"}])
    held = write_results(path, [{"chunks_target": 100_000, "run": "b"}, {"chunks_target": 1_000_000, "run": "b"}])
    assert [(e["chunks_target"], e["run"]) for e in held] == [(10_000, "a"), (100_000, "b"), (1_000_000, "b")]
    assert read_results(path) == held
    assert read_results(tmp_path / "missing.json") == []


def test_a_file_that_is_not_a_results_file_is_refused(tmp_path: Path) -> None:
    broken, other = tmp_path / "broken.json", tmp_path / "other.json"
    broken.write_text("{", encoding="utf-8")
    other.write_text(json.dumps({"sizes": [{"chunks": 1}]}), encoding="utf-8")
    with pytest.raises(ValueError, match="not JSON"):
        read_results(broken)
    with pytest.raises(ValueError, match="not a scale results file"):
        write_results(other, [{"chunks_target": 1}])
    assert json.loads(other.read_text(encoding="utf-8")) == {"sizes": [{"chunks": 1}]}, "a refused file is kept"


def test_status_fields_and_a_pools_memory() -> None:
    main = status_fields("Name:\tcelery\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t4\n")
    child = status_fields("VmHWM:\t  307200 kB\nVmRSS:\t   51200 kB\n")
    assert main == {"VmHWM": 200.0, "VmRSS": 100.0}
    assert pool_memory([main, child]) == {"rss_mb": 150.0, "largest_rss_mb": 100.0, "peak_rss_mb": 300.0,
                                          "processes": 2}


def test_paired_order_runs_every_query_once_each_way_apart() -> None:
    pairs = paired_order(6)
    assert sorted(a for a, _ in pairs) == sorted(b for _, b in pairs) == list(range(6))
    assert all(a != b for a, b in pairs)
