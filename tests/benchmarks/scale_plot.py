"""Draw the scale benchmark's results (``docs/figures/scale.json``) as one PNG: how each figure grows with the
number of chunks (log x), one panel per kind of figure.

    python -m tests.benchmarks.scale_plot [RESULTS.json [OUT.png]]

Defaults: the results file of :mod:`tests.benchmarks.scale_results` and ``scale.png`` beside it. Runs with
matplotlib's Agg backend: no display needed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter  # noqa: E402

from tests.benchmarks.scale_results import read_results, results_path  # noqa: E402

Entry = dict[str, Any]
# A line of a panel: its label, and how to read its figure from an entry.
Line = tuple[str, Callable[[Entry], float]]
POOLS = ("ingest", "embed", "maintenance", "query")


def _get(*keys: str) -> Callable[[Entry], float]:
    def figure(entry: Entry) -> float:
        value: Any = entry
        for key in keys:
            value = value[key]
        return float(value)

    return figure


# Each panel: its title, its y unit, whether y is logarithmic, and its lines.
PANELS: tuple[tuple[str, str, bool, tuple[Line, ...]], ...] = (
    ("Hybrid query, k=10 (cache off)", "ms", False, (
        ("in-process p50", _get("query", "inprocess_p50_ms")), ("in-process p99", _get("query", "inprocess_p99_ms")),
        ("RPC p50", _get("query", "rpc_p50_ms")), ("RPC p99", _get("query", "rpc_p99_ms")))),
    ("Write → searchable, both legs", "ms", False, (
        ("p50", _get("freshness", "both_legs_p50_ms")), ("p99", _get("freshness", "both_legs_p99_ms")))),
    ("Memory (resident, all processes of a pool)", "MiB", False, (
        *((f"{pool} pool", _get("memory_mb", pool, "rss_mb")) for pool in POOLS),
        ("one BM25 merge (peak)", _get("load", "bm25_merge_peak_rss_mb")))),
    ("Disk per chunk", "bytes", False, (
        ("total", _get("disk", "disk_bytes_per_chunk")),
        ("chunks + HNSW", _get("disk", "disk_bytes_per_chunk_by_kind", "chunks")),
        ("grep blocks", _get("disk", "disk_bytes_per_chunk_by_kind", "grep_blocks")),
        ("BM25 published", _get("disk", "disk_bytes_per_chunk_by_kind", "bm25_published")),
        ("BM25 directory", _get("disk", "disk_bytes_per_chunk_by_kind", "bm25_directory")))),
    ("Index builds (4 shards, one after another)", "s", True, (
        ("HNSW build", _get("load", "hnsw_build_s")), ("BM25 merge", _get("load", "bm25_merge_s")))),
    ("Bulk load through the pipeline's stages", "chunks/s", False, (
        ("write (chunk, embed, COPY)", _get("load", "write_chunks_per_s")),)),
)


def _series(entries: Sequence[Entry], figure: Callable[[Entry], float]) -> tuple[list[int], list[float]]:
    """The sizes that have the figure, and its values (an entry without it, from an older run, is left out)."""
    xs, ys = [], []
    for entry in entries:
        try:
            value = figure(entry)
        except (KeyError, TypeError, ValueError):
            continue
        xs.append(int(entry["chunks"]))
        ys.append(value)
    return xs, ys


def _draw(ax: Axes, entries: Sequence[Entry], title: str, unit: str, log_y: bool, lines: Sequence[Line]) -> None:
    for label, figure in lines:
        xs, ys = _series(entries, figure)
        if xs:
            ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(ScalarFormatter())  # 20, not 2×10¹
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)  # growth read against zero, not against the smallest size
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("chunks")
    ax.set_ylabel(unit)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def plot(entries: Sequence[Entry], out: Path) -> Path:
    """Draw ``entries`` (the results file's ``sizes``) into the PNG ``out``; returns ``out``."""
    if not entries:
        raise ValueError("no sizes to plot: run the scale benchmark first (make bench-scale)")
    ordered = sorted(entries, key=lambda e: int(e["chunks"]))
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    try:
        for ax, (title, unit, log_y, lines) in zip(axes.flat, PANELS, strict=True):
            _draw(ax, ordered, title, unit, log_y, lines)
        shards = ordered[-1].get("shards", "?")
        sizes = ", ".join(f"{int(e['chunks']):,}" for e in ordered)
        fig.suptitle(f"shardfuse at scale: {shards} shards, hashing embedder ({sizes} chunks)")
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out


def main(argv: Sequence[str]) -> int:
    source = Path(argv[0]) if argv else results_path()
    out = Path(argv[1]) if len(argv) > 1 else source.with_suffix(".png")
    try:
        written = plot(read_results(source), out)
    except ValueError as exc:
        print(f"scale_plot: {exc}", file=sys.stderr)
        return 1
    print(f"scale_plot: {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
