"""This revision's ingest path against a baseline revision's, runs taking turns: the way to tell a change of a
few percent of ingest throughput from the host's drift (two runs of the same code have differed by 10 % here).

    make bench-ab-ingest BASELINE=<git revision>   # or: python -m tests.benchmarks.ingest_ab <revision>

How: the baseline is checked out into a temporary ``git worktree``. Each run
(:mod:`tests.benchmarks.ingest_ab_side`, a fresh process) starts a stack of its own with its side's package
(the workers inherit it), publishes ``bench_ingest``'s documents (``SHARDFUSE_BENCH_CHUNKS`` chunks, 30,000 by
default: a third of ``bench_ingest``'s, so a pair takes ~3 minutes) and times them until searchable in both
legs, as ``bench_ingest``'s "pipeline" row does. ``--pairs`` pairs alternate this tree and the baseline, the
order swapped every pair. Reported: each run's chunks/s and CPU seconds per part of the stack, each side's
medians, each pair's difference (this − baseline) and in how many pairs this side was faster. The harness is
this tree's ``tests/benchmarks``: a baseline whose stack cannot be started by it cannot be compared this way.
The last line is JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.benchmarks.worktrees import REPO, ab_command_line, baseline_worktree, describe_head, parse_ab

DEFAULT_CHUNKS = 30_000


@dataclass(frozen=True)
class Run:
    side: str  # "this" or "baseline"
    pair: int
    chunks_per_s: float
    cpu_s: dict[str, float]


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Each side's median chunks/s and CPU seconds per part, each pair's difference in chunks/s (this −
    baseline) and in how many pairs this side was faster."""
    sides = {side: [r for r in runs if r.side == side] for side in ("this", "baseline")}
    medians: dict[str, dict[str, Any]] = {}
    for side, side_runs in sides.items():
        if side_runs:
            parts = sorted({part for r in side_runs for part in r.cpu_s})
            medians[side] = {
                "chunks_per_s": round(statistics.median(r.chunks_per_s for r in side_runs), 1),
                "cpu_s": {part: round(statistics.median(r.cpu_s.get(part, 0.0) for r in side_runs), 1)
                          for part in parts},
            }
    deltas = []
    for pair in sorted({r.pair for r in runs}):
        by_side = {r.side: r for r in runs if r.pair == pair}
        if len(by_side) == 2:
            deltas.append(round(by_side["this"].chunks_per_s - by_side["baseline"].chunks_per_s, 1))
    return {
        "medians": medians,
        "pair_deltas_chunks_per_s": deltas,
        "median_delta_chunks_per_s": round(statistics.median(deltas), 1) if deltas else None,
        "pairs_this_faster": sum(d > 0 for d in deltas),
        "pairs": len(deltas),
    }


def _run_side(side: str, pair: int, *, package: Path, pythonpath: str | None, chunks: int) -> Run:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, "-m", "tests.benchmarks.ingest_ab_side", "--root", str(package),
                           "--chunks", str(chunks)], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {side} side failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    run = Run(side=side, pair=pair, chunks_per_s=figures["chunks_per_s"], cpu_s=figures["cpu_s"])
    pools = ", ".join(f"{part} {seconds}" for part, seconds in sorted(run.cpu_s.items()))
    print(f"pair {pair} {side:<8} {run.chunks_per_s:7.1f} chunks/s ({figures['chunks']:,} chunks in "
          f"{figures['seconds']} s); CPU s: {pools}", flush=True)
    return run


def main(argv: list[str] | None = None) -> int:
    args, baseline = parse_ab(ab_command_line(__doc__, pairs=3), argv)
    chunks = int(os.environ.get("SHARDFUSE_BENCH_CHUNKS", str(DEFAULT_CHUNKS)))
    head = describe_head()
    print(f"this: {head}, baseline: {baseline[:9]}; {chunks:,} chunks a run", flush=True)
    runs: list[Run] = []
    with baseline_worktree(baseline) as old:
        sides = {"this": (REPO, None), "baseline": (old.tree, old.pythonpath)}
        for pair in range(1, args.pairs + 1):
            for side in ("this", "baseline") if pair % 2 else ("baseline", "this"):
                package, pythonpath = sides[side]
                runs.append(_run_side(side, pair, package=package, pythonpath=pythonpath, chunks=chunks))
    summary = summarize(runs)
    print(f"\nmedians: this {summary['medians']['this']}, baseline {summary['medians']['baseline']}")
    print(f"this − baseline per pair (chunks/s): {summary['pair_deltas_chunks_per_s']}; this faster in "
          f"{summary['pairs_this_faster']} of {summary['pairs']} pairs")
    print(json.dumps({"bench": "ingest_ab", "this": head, "baseline": baseline, "chunks": chunks, **summary},
                     sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
