"""This revision's CPU-bound ingest parts against a baseline revision's: the BM25 tokenizer, the hashing
embedder and semantic chunking, each side in a fresh process (:mod:`tests.benchmarks.parts_ab_side`), the sides
taking turns. For a change to one of them: its CPU on the same texts, and whether it still produces exactly
what the baseline did (a digest of every token list, vector and chunk).

    python -m tests.benchmarks.parts_ab <git revision> [--pairs 2]

Reported: each part's CPU seconds on each side (the median over the pairs), this side's over the baseline's,
and every part whose output differs. The last line is JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.benchmarks.worktrees import REPO, ab_command_line, baseline_worktree, describe_head, parse_ab


def _side(package: Path, pythonpath: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, "-m", "tests.benchmarks.parts_ab_side", "--root", str(package)],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the side at {package} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each part's median CPU seconds per side, this side's over the baseline's, and the parts whose output
    differs between the sides (or between two runs of one side)."""
    parts = sorted(key[:-2] for key in runs["this"][0] if key.endswith("_s"))
    seconds = {side: {part: round(statistics.median(run[part + "_s"] for run in side_runs), 4) for part in parts}
               for side, side_runs in runs.items()}
    differs = sorted(part for part in parts
                     if len({run[part + "_digest"] for side_runs in runs.values() for run in side_runs}) > 1)
    return {"seconds": seconds, "differs": differs,
            "ratio": {part: round(seconds["this"][part] / seconds["baseline"][part], 3) for part in parts}}


def main(argv: list[str] | None = None) -> int:
    args, baseline = parse_ab(ab_command_line(__doc__, pairs=2), argv)
    head = describe_head()
    print(f"this: {head}, baseline: {baseline[:9]}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "baseline": []}
    with baseline_worktree(baseline) as old:
        sides = {"this": (REPO, None), "baseline": (old.tree, old.pythonpath)}
        for pair in range(1, args.pairs + 1):
            for side in ("this", "baseline") if pair % 2 else ("baseline", "this"):
                runs[side].append(_side(*sides[side]))
                print(f"pair {pair} {side:<8} " + ", ".join(f"{k[:-2]} {v}" for k, v in sorted(runs[side][-1].items())
                                                           if k.endswith("_s")), flush=True)
    summary = compare(runs)
    for part, ratio in summary["ratio"].items():
        print(f"{part:<22} this {summary['seconds']['this'][part]:.4f} s, baseline "
              f"{summary['seconds']['baseline'][part]:.4f} s: {ratio:.3f}"
              + ("   OUTPUT DIFFERS" if part in summary["differs"] else ""))
    print(json.dumps({"bench": "parts_ab", "this": head, "baseline": baseline, "pairs": args.pairs, **summary},
                     sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
