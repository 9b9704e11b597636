"""This revision's query path against a baseline revision's, taking turns on one loaded stack: the way to tell a
change of a millisecond from the host's drift (three ``bench_query`` runs of the same code have differed by 2 ms
at p50 here, more than most changes to the query path).

    make bench-ab BASELINE=<git revision>      # or: python -m tests.benchmarks.query_ab <revision>

How: the baseline is checked out into a temporary ``git worktree``. One stack (the ``bench_query`` shape:
hashing embedder, 4 shards, ``SHARDFUSE_BENCH_CHUNKS`` chunks loaded by :mod:`tests.benchmarks.direct_load`
with *this* revision's code) is held while ``--pairs`` pairs of runs of :mod:`tests.benchmarks.ab_side`
alternate, each in a fresh process: this working tree's package, then the baseline's, and the other way
round in the next pair, so drift of the host falls on both sides alike. Each run warms up, then times
``--rounds`` passes over 1,000 SciFact queries in process (hybrid, k 10, no caches), as ``bench_query``'s
in-process figure does. Reported: each run's p50 / p99 / CPU per query of the searching process, each side's
medians, each pair's difference (this − baseline), and how many queries got the same top 10 on both sides.
Both sides search what this revision wrote, so a change to what is stored (DDL, index layout) cannot be
compared this way. The last line is JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.benchmarks.worktrees import REPO, ab_command_line, baseline_worktree, describe_head, parse_ab

SIDE = Path(__file__).resolve().with_name("ab_side.py")
ZONE = "bench"
SHARDS = 4
QUERIES = 1000
WARM_QUERIES = 100


@dataclass(frozen=True)
class Run:
    side: str  # "this" or "baseline"
    pair: int
    p50_ms: float
    p99_ms: float
    cpu_ms_per_query: float


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Each side's medians, each pair's difference (this − baseline) and in how many pairs this side was faster."""
    sides = {side: [r for r in runs if r.side == side] for side in ("this", "baseline")}
    medians = {side: {measure: round(statistics.median(getattr(r, measure) for r in side_runs), 2)
                      for measure in ("p50_ms", "p99_ms", "cpu_ms_per_query")}
               for side, side_runs in sides.items() if side_runs}
    deltas: list[dict[str, float]] = []
    for pair in sorted({r.pair for r in runs}):
        by_side = {r.side: r for r in runs if r.pair == pair}
        if len(by_side) == 2:
            deltas.append({measure: round(getattr(by_side["this"], measure) - getattr(by_side["baseline"], measure), 2)
                           for measure in ("p50_ms", "cpu_ms_per_query")})
    return {
        "medians": medians,
        "pair_deltas": deltas,
        "median_delta_p50_ms": round(statistics.median(d["p50_ms"] for d in deltas), 2) if deltas else None,
        "median_delta_cpu_ms": round(statistics.median(d["cpu_ms_per_query"] for d in deltas), 2) if deltas else None,
        "pairs_this_faster": sum(d["p50_ms"] < 0 for d in deltas),
        "pairs": len(deltas),
    }


def same_top10(a: dict[str, list[str]], b: dict[str, list[str]]) -> tuple[int, int]:
    """(queries whose top 10 is identical on both sides, queries both sides answered)."""
    common = a.keys() & b.keys()
    return sum(a[q] == b[q] for q in common), len(common)


def _run_side(side: str, pair: int, *, package: Path, pythonpath: str | None, files: dict[str, Path],
              rounds: int) -> tuple[Run, dict[str, list[str]]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    answers = files["dir"] / f"answers-{side}-{pair}.json"
    done = subprocess.run(
        [sys.executable, str(SIDE), "--settings", str(files["settings"]), "--queries", str(files["queries"]),
         "--answers", str(answers), "--root", str(package), "--rounds", str(rounds)],
        cwd=package, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {side} side failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    run = Run(side=side, pair=pair, p50_ms=figures["p50_ms"], p99_ms=figures["p99_ms"],
              cpu_ms_per_query=figures["cpu_ms_per_query"])
    print(f"pair {pair} {side:<8} p50 {run.p50_ms:6.2f} ms  p99 {run.p99_ms:6.2f} ms  "
          f"CPU {run.cpu_ms_per_query:5.2f} ms/query  ({figures['wall_s']} s)", flush=True)
    return run, json.loads(answers.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = ab_command_line(__doc__, pairs=4)
    parser.add_argument("--rounds", type=int, default=2, help="passes over the 1,000 queries per run (default 2)")
    args, baseline = parse_ab(parser, argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    # Imported here: they need the data directory and this revision's stack, not needed for --help.
    from tests.benchmarks import direct_load, scale

    if not (scale.DATA / "scifact" / "queries.jsonl").is_file():
        parser.error(f"the benchmark corpus and queries (SciFact) are not under {scale.DATA}")
    chunks = int(os.environ.get("SHARDFUSE_BENCH_CHUNKS", "100000"))
    head = describe_head()
    with baseline_worktree(baseline) as old:
        queries = scale.queries(QUERIES + WARM_QUERIES)
        files = {"dir": old.work, "settings": old.work / "settings.json",
                 "queries": old.work / "queries.json"}
        files["queries"].write_text(json.dumps({"zone": ZONE, "timed": queries[:QUERIES],
                                                "warm": queries[QUERIES:]}), encoding="utf-8")
        with scale.bench_stack(shards=SHARDS, SHARDFUSE_WORKERS__QUERY_CONCURRENCY="2") as stack:
            started = time.perf_counter()
            docs = scale.corpus(int(chunks / 1.1) + 100)
            loaded = direct_load.load(stack.settings,
                                      direct_load.prepare(docs, zone=ZONE, settings=stack.settings,
                                                          max_chunks=chunks))
            print(f"loaded {loaded.chunks:,} chunks into {SHARDS} shards in {time.perf_counter() - started:.0f} s; "
                  f"this: {head}, baseline: {baseline[:9]}", flush=True)
            files["settings"].write_text(stack.settings.model_dump_json(), encoding="utf-8")
            sides = {"this": (REPO, None), "baseline": (old.tree, old.pythonpath)}
            runs: list[Run] = []
            answers: dict[str, dict[str, list[str]]] = {}
            for pair in range(1, args.pairs + 1):
                order = ("this", "baseline") if pair % 2 else ("baseline", "this")
                for side in order:
                    package, pythonpath = sides[side]
                    run, answers[side] = _run_side(side, pair, package=package, pythonpath=pythonpath,
                                                   files=files, rounds=args.rounds)
                    runs.append(run)
    identical, compared = same_top10(answers["this"], answers["baseline"])
    summary = summarize(runs)
    print(f"\nmedians: this {summary['medians']['this']}, baseline {summary['medians']['baseline']}")
    print(f"this − baseline per pair: {summary['pair_deltas']}; this faster at p50 in "
          f"{summary['pairs_this_faster']} of {summary['pairs']} pairs; identical top 10: {identical} / {compared}")
    print(json.dumps({"bench": "query_ab", "this": head, "baseline": baseline, "chunks": loaded.chunks,
                      "rounds": args.rounds, **summary, "identical_top10": identical, "compared": compared},
                     sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
