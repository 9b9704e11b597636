"""The ingest parts A/B: medians per side, this side over the baseline, and any part whose output changed
(between the sides, or between two runs of one side) named; a bad revision is refused before anything runs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.benchmarks.parts_ab import compare, main


def _run(tokenizer_s: float, digest: str = "same") -> dict[str, Any]:
    return {"tokenizer_s": tokenizer_s, "tokenizer_digest": "t", "hashing_s": 1.0, "hashing_digest": digest}


def test_each_part_is_compared_at_its_medians_and_a_changed_output_is_named() -> None:
    summary = compare({"this": [_run(0.2), _run(0.4), _run(0.3)],
                       "baseline": [_run(0.5), _run(0.6), _run(0.4, digest="other")]})
    assert summary["seconds"]["this"] == {"hashing": 1.0, "tokenizer": 0.3}
    assert summary["ratio"] == {"hashing": 1.0, "tokenizer": 0.6}
    assert summary["differs"] == ["hashing"]


def test_the_same_output_on_both_sides_is_not_reported() -> None:
    assert compare({"this": [_run(0.2)], "baseline": [_run(0.3)]})["differs"] == []


def test_a_revision_that_names_no_commit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["no-such-revision-anywhere"])
    assert exited.value.code == 2
    assert "is not a revision" in capsys.readouterr().err
