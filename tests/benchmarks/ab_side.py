"""One side of :mod:`tests.benchmarks.query_ab`: in-process hybrid searches against a stack that is already
loaded, with whichever ``shardfuse`` package is first on ``sys.path`` (this revision's, or the baseline's
from a ``git worktree``). Run as a script, not as part of ``tests``, so that it imports nothing but the
package under test; prints one JSON line.

    python tests/benchmarks/ab_side.py --settings S.json --queries Q.json --answers A.json --root DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", type=Path, required=True, help="the held stack's settings (JSON)")
    parser.add_argument("--queries", type=Path, required=True, help="{'warm': [...], 'timed': [...]} (JSON)")
    parser.add_argument("--answers", type=Path, required=True, help="where to write each query's top chunk ids")
    parser.add_argument("--root", type=Path, required=True, help="the package directory that must be imported")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the timed queries")
    args = parser.parse_args(argv)

    import shardfuse
    from shardfuse.pipeline.config.settings import settings_from_json
    from shardfuse.query.request import parse_request
    from shardfuse.workers.runtime import WorkerRuntime

    imported = Path(shardfuse.__file__).resolve().parent
    if imported != args.root.resolve():
        print(f"ab_side: imported shardfuse from {imported}, not {args.root}", file=sys.stderr)
        return 2
    settings = settings_from_json(args.settings.read_text(encoding="utf-8"))
    queries = json.loads(args.queries.read_text(encoding="utf-8"))
    runtime = WorkerRuntime(settings)
    try:
        def search(query: str) -> dict[str, Any]:
            arguments = {"query": query, "zone": queries["zone"], "k": 10, "mode": "hybrid", "cache": False}
            answer: dict[str, Any] = runtime.searcher.search(parse_request(arguments, settings=settings.query))
            return answer

        for query in queries["warm"]:
            search(query)
        latencies: list[float] = []
        answers: dict[str, list[str]] = {}
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        for _ in range(args.rounds):
            for query in queries["timed"]:
                started = time.perf_counter()
                answer = search(query)
                latencies.append((time.perf_counter() - started) * 1000)
                answers[query] = [hit["chunk_id"] for hit in answer["results"]]
        cpu_ms = (time.process_time() - cpu_before) / len(latencies) * 1000
        wall_s = time.perf_counter() - wall_before
    finally:
        runtime.close()
    args.answers.write_text(json.dumps(answers), encoding="utf-8")
    latencies.sort()
    print(json.dumps({"p50_ms": round(statistics.median(latencies), 3),
                      "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
                      "cpu_ms_per_query": round(cpu_ms, 3), "queries": len(latencies), "wall_s": round(wall_s, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
