"""Where an ingest's CPU goes, pool by pool: ``bench_ingest``'s load (:mod:`tests.benchmarks.ingest_ab_side`,
30,000 chunks by default) with py-spy attached to every Celery pool (``--gil``: only the thread holding the GIL
is sampled, so waits do not count), then each pool's functions by their share of its samples.

    python -m tests.benchmarks.ingest_profile [--out DIR] [--seconds 45] [--delay 8] [--top 40]

py-spy's raw stacks stay in ``--out`` (one file per pool) for a closer look. The side's own JSON line (chunks/s,
CPU seconds per part) is printed too: the samplers slow the run, so time an unprofiled run for throughput.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tests.benchmarks.worktrees import REPO

_LINE = re.compile(r":\d+\)")
# Frames that wrap nearly every sample (interpreter start-up, Celery's command line and boot steps, thread and
# pool entry points): left out of the ranking, which is meant to show where the work is.
_WRAPPERS = ("<frozen ", "click/", "celery/bin/", "celery/__main__", "celery/bootsteps", "celery/worker/worker.py",
             "celery/worker/consumer/consumer.py", "celery/worker/loops.py", "celery/concurrency/",
             "celery/app/trace.py", "kombu/asynchronous/hub.py", "threading.py", "billiard/",
             "concurrent/futures/thread.py", "importlib/")


def shares(raw: Path) -> tuple[int, list[tuple[str, float]]]:
    """The samples in py-spy's raw output ``raw`` and each function's inclusive share of them, largest first."""
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        frames = {_LINE.sub(")", frame) for frame in stack.split(";") if not frame.startswith("process ")}
        for frame in frames:
            if any(wrapper in frame for wrapper in _WRAPPERS):
                continue
            inclusive[frame] += int(count)
    return total, [(frame, n / total) for frame, n in inclusive.most_common()] if total else []


def _pools(side: subprocess.Popen[str], wait_s: float) -> dict[str, int]:
    """The main process of each Celery pool the side's stack started, by its queue."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and side.poll() is None:
        found: dict[str, int] = {}
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = proc.info["cmdline"] or []
            if not ("celery" in " ".join(cmd) and "worker" in cmd and "-Q" in cmd):
                continue
            try:  # a pool's main process, not one of its children (py-spy follows those from it)
                parent = proc.parent()
                main_process = parent is None or "worker" not in parent.cmdline()
            except psutil.Error:  # it, or its parent, ended meanwhile
                continue
            if main_process:
                found[cmd[cmd.index("-Q") + 1]] = proc.info["pid"]
        if {"ingest", "embed", "maintenance"} <= found.keys():
            return found
        time.sleep(0.5)
    raise SystemExit("the side's worker pools did not start")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "shardfuse-ingest-profile")
    parser.add_argument("--chunks", type=int, default=30_000)
    parser.add_argument("--seconds", type=int, default=45, help="how long each pool is sampled")
    parser.add_argument("--delay", type=float, default=8.0, help="seconds between the pools' start and sampling")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    side = subprocess.Popen([sys.executable, "-m", "tests.benchmarks.ingest_ab_side", "--root", str(REPO),
                             "--chunks", str(args.chunks)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        pools = _pools(side, wait_s=180)
        time.sleep(args.delay)  # past the pools' start-up, into the load
        samplers = {queue: subprocess.Popen([str(spy), "record", "-p", str(pid), "--subprocesses", "--gil",
                                             "-r", "50", "-f", "raw", "-d", str(args.seconds), "--nonblocking",
                                             "-o", str(args.out / f"{queue}.txt")],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    for queue, pid in pools.items()}
        for sampler in samplers.values():
            sampler.wait()
        output, _ = side.communicate()
    finally:
        if side.poll() is None:  # the pools never started, or we were interrupted: the side stops its stack
            side.send_signal(signal.SIGINT)  # a KeyboardInterrupt there runs its stack's shutdown; SIGTERM would not
            try:
                side.wait(120)
            except subprocess.TimeoutExpired:
                side.kill()
    for queue in samplers:
        raw = args.out / f"{queue}.txt"
        if not raw.exists():
            print(f"\n{queue}: no samples (py-spy could not attach: it needs ptrace permission)")
            continue
        total, ranked = shares(raw)
        print(f"\n{queue}: {total} samples")
        for frame, share in ranked[:args.top]:
            print(f"  {100 * share:5.1f} %  {frame[:140]}")
    print(output.strip().splitlines()[-1] if output.strip() else "the side printed nothing")
    return side.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
