"""The scale benchmark's plot: a PNG drawn from a results file, whatever figures an older entry lacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib import image

from tests.benchmarks.scale_plot import main, plot
from tests.benchmarks.scale_results import write_results


def _entry(chunks: int) -> dict[str, Any]:
    grow = chunks / 10_000
    pools = {pool: {"rss_mb": 100 + grow} for pool in ("ingest", "embed", "maintenance", "query")}
    return {"chunks_target": chunks, "chunks": chunks, "shards": 4,
            "query": {"inprocess_p50_ms": 8 + grow, "inprocess_p99_ms": 20 + grow, "rpc_p50_ms": 12 + grow,
                      "rpc_p99_ms": 30 + grow},
            "freshness": {"both_legs_p50_ms": 300.0, "both_legs_p99_ms": 500.0},
            "memory_mb": pools,
            "load": {"hnsw_build_s": grow, "bm25_merge_s": 2 * grow, "write_chunks_per_s": 900.0,
                     "bm25_merge_peak_rss_mb": 300.0},
            "disk": {"disk_bytes_per_chunk": 9000, "disk_bytes_per_chunk_by_kind": {
                "chunks": 4000, "grep_blocks": 2000, "bm25_published": 2000, "bm25_directory": 1000}}}


def test_a_results_file_becomes_a_png_of_every_size(tmp_path: Path) -> None:
    results = tmp_path / "scale.json"
    older = {"chunks_target": 1_000, "chunks": 1_000, "query": {"inprocess_p50_ms": 5.0}}  # most figures missing
    write_results(results, [older, _entry(10_000), _entry(100_000)])
    out = tmp_path / "figures" / "scale.png"
    assert main([str(results), str(out)]) == 0
    pixels = image.imread(out)
    assert pixels.shape[0] > 400 and pixels.shape[1] > 800
    assert pixels.std() > 0.01, "a blank picture"


def test_the_png_defaults_beside_the_results_file(tmp_path: Path) -> None:
    results = tmp_path / "scale.json"
    write_results(results, [_entry(10_000)])
    assert main([str(results)]) == 0
    assert (tmp_path / "scale.png").stat().st_size > 10_000


def test_nothing_to_plot_is_an_error_that_says_what_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing.json"), str(tmp_path / "out.png")]) == 1
    assert "make bench-scale" in capsys.readouterr().err
    assert not (tmp_path / "out.png").exists()
    with pytest.raises(ValueError):
        plot([], tmp_path / "out.png")
    (tmp_path / "bad.json").write_text(json.dumps([1, 2]), encoding="utf-8")
    assert main([str(tmp_path / "bad.json")]) == 1
