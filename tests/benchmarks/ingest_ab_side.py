"""One side of :mod:`tests.benchmarks.ingest_ab`: a stack of its own (``bench_ingest``'s: hashing embedder,
2 shards) started with whichever ``shardfuse`` package is first on ``sys.path`` (its workers inherit the
path), ``bench_ingest``'s documents published into it and timed until everything is searchable in both legs
(``scale.wait_searchable``). Prints one JSON line: chunks, seconds, chunks/s, and the CPU seconds each part
of the stack spent, read from ``/proc`` once a second (a process that ends between two reads, such as a
parallel index build's worker, loses at most its last second).

    python -m tests.benchmarks.ingest_ab_side --root DIR --chunks N
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import psutil


class CpuMeter:
    """CPU seconds of each component's process tree since :meth:`start`, sampled once a second."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = pids
        self._seen: dict[str, dict[int, float]] = {name: {} for name in pids}
        self._base: dict[str, dict[int, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> dict[str, dict[int, float]]:
        now: dict[str, dict[int, float]] = {}
        for name, pid in self._pids.items():
            found: dict[int, float] = {}
            try:
                root = psutil.Process(pid)
                for proc in [root, *root.children(recursive=True)]:
                    try:
                        times = proc.cpu_times()
                        found[proc.pid] = times.user + times.system
                    except psutil.Error:
                        continue
            except psutil.Error:
                pass
            now[name] = found
        return now

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for name, found in self._sample().items():
                self._seen[name].update(found)

    def start(self) -> None:
        self._base = self._sample()
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        for name, found in self._sample().items():
            self._seen[name].update(found)
        return {name: round(sum(cpu - self._base[name].get(pid, 0.0) for pid, cpu in seen.items()), 1)
                for name, seen in self._seen.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="the package directory that must be imported")
    parser.add_argument("--chunks", type=int, required=True, help="about this many chunks")
    args = parser.parse_args(argv)

    import shardfuse

    imported = Path(shardfuse.__file__).resolve().parent
    if imported != args.root.resolve():
        print(f"ingest_ab_side: imported shardfuse from {imported}, not {args.root}", file=sys.stderr)
        return 2
    from tests.benchmarks.bench_ingest import ABSTRACTS, SHARDS, docs_for
    from tests.benchmarks.scale import bench_stack, chunk_count, publish_many, wait_searchable

    with bench_stack(shards=SHARDS) as stack:
        docs = docs_for(args.chunks, ABSTRACTS, stack.settings)
        meter = CpuMeter({name: component.pid for name, component in stack.state.components.items()})
        meter.start()
        cpu_before, started = time.process_time(), time.perf_counter()
        publish_s = publish_many(stack, "bulk", docs)
        wait_searchable(stack)
        seconds = time.perf_counter() - started
        cpu = {**meter.stop(), "publisher": round(time.process_time() - cpu_before, 1)}
        chunks = chunk_count(stack, "bulk")
    print(json.dumps({"chunks": chunks, "documents": len(docs), "seconds": round(seconds, 2),
                      "chunks_per_s": round(chunks / seconds, 1), "publish_seconds": round(publish_s, 2),
                      "cpu_s": cpu}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
