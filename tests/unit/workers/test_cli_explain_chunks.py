"""``shardfuse explain-chunks --json`` with the entropy filter off: every chunk is kept, each row says what
the filter would do and carries its context."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from shardfuse.workers.cli.main import main

WRITES = "Shard writes replace a document's chunks in one transaction with COPY BINARY and the version rule."
QUERIES = "Query workers fan out to every shard, fuse BM25 and vector results with RRF and apply boosts."


def test_json_rows_show_what_the_filter_would_drop_when_it_is_off(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "notes.txt"
    source.write_text(f"{WRITES}\n\n{QUERIES}\n\n{WRITES}\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {"SHARDFUSE_CHUNKING__MAX_TOKENS": "24", "SHARDFUSE_CHUNKING__OVERLAP_TOKENS": "0",
                           "SHARDFUSE_ENTROPY__ENABLED": "false"}.items():
            patch.setenv(key, value)
        assert main(["explain-chunks", str(source), "--zone", "z", "--as", "docs/notes.txt", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(row["ordinal"], row["lines"]) for row in rows] == [(0, [1, 2]), (1, [3, 4]), (2, [5, 5])]
    assert [row["fate"] for row in rows] == ["kept", "kept", "kept (filter off; would drop: duplicate)"]
    assert rows[2]["score"] is None and rows[0]["score"] is not None  # a duplicate is dropped before scoring
    assert all(row["context"] for row in rows)  # nothing is dropped, so every chunk has its context


def test_a_file_over_the_size_limit_is_reported_as_ingest_reports_it_without_being_read_whole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "huge.txt"
    source.write_bytes(b"a" * (32 * 1024 * 1024))
    monkeypatch.setenv("SHARDFUSE_LIMITS__MAX_FILE_BYTES", "1000")
    tracemalloc.start()
    try:
        assert main(["explain-chunks", str(source), "--zone", "z"]) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert capsys.readouterr().out.strip() == f"{source}: not indexed: too large: 33,554,432 bytes > limit 1,000"
    assert peak < 8 * 1024 * 1024, f"{peak / 2**20:.1f} MiB held to explain a 32 MiB file"  # never the whole file
