"""The ingest profile's ranking of py-spy's raw stacks: inclusive shares, a recursive frame counted once a
sample, and the frames that wrap every sample left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.ingest_profile import shares


def test_functions_are_ranked_by_their_inclusive_share_without_the_wrappers(tmp_path: Path) -> None:
    raw = tmp_path / "embed.txt"
    raw.write_text(
        'process 7:"celery worker";Thread.run (threading.py:1);embed (shardfuse/workers/tasks/embed.py:3);'
        "walk (shardfuse/x.py:5);walk (shardfuse/x.py:6) 3\n"
        'process 7:"celery worker";Thread.run (threading.py:1);embed (shardfuse/workers/tasks/embed.py:3) 1\n'
        "\n", encoding="utf-8")
    total, ranked = shares(raw)
    assert total == 4
    assert ranked == [("embed (shardfuse/workers/tasks/embed.py)", 1.0), ("walk (shardfuse/x.py)", 0.75)]


def test_no_samples_is_an_empty_ranking(tmp_path: Path) -> None:
    raw = tmp_path / "query.txt"
    raw.write_text("", encoding="utf-8")
    assert shares(raw) == (0, [])


@pytest.mark.parametrize("line", ["no count here", "frame (a.py:1) x"])
def test_lines_without_a_sample_count_are_skipped(tmp_path: Path, line: str) -> None:
    raw = tmp_path / "ingest.txt"
    raw.write_text(line + "\nwork (shardfuse/a.py:1) 2\n", encoding="utf-8")
    assert shares(raw) == (2, [("work (shardfuse/a.py)", 1.0)])
