"""A prefork pool in miniature, for the tests of multiprocess metrics: a process started with
``PROMETHEUS_MULTIPROC_DIR`` in its environment (as a pool's launcher does) forks children that count
through :mod:`shardfuse.pipeline.observability.metrics` on several threads each, then end as Celery's prefork
children do (``os._exit``, after marking themselves dead) or, for the last ``kill`` of them, by SIGKILL once
they have counted.

Tests call :func:`count_in_children`; it runs this module as ``python -m tests.support.counting_processes``
with a JSON plan on stdin. Each thread of each child runs the whole plan: a list of
``[function, metric, value, labels]``, ``function`` ``inc`` or ``observe``, ``metric`` a name in
:mod:`~shardfuse.pipeline.observability.metrics` (``EVENTS`` …).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

Plan = list[tuple[str, str, float, dict[str, str]]]


def count_in_children(directory: Path, plan: Plan, *, children: int, threads: int = 1, kill: int = 0) -> list[int]:
    """Run ``plan`` on ``threads`` threads of each of ``children`` forked processes counting into
    ``directory``; the last ``kill`` children are SIGKILLed after counting. Returns the children's pids."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    request = {"plan": plan, "children": children, "threads": threads, "kill": kill}
    done = subprocess.run([sys.executable, "-m", "tests.support.counting_processes"], input=json.dumps(request),
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    pids: list[int] = json.loads(done.stdout)
    return pids


def _run_plan(plan: Plan, threads: int) -> None:
    from shardfuse.pipeline.observability import metrics

    def work() -> None:
        for function, name, value, labels in plan:
            getattr(metrics, function)(getattr(metrics, name), value, **labels)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def _child(plan: Plan, threads: int, report: int, *, linger: bool) -> None:
    """In a forked child: count, say so, then end (or wait to be killed)."""
    from shardfuse.pipeline.observability import multiprocess

    code = 0
    try:
        _run_plan(plan, threads)
        os.write(report, b"x")
        if linger:
            signal.pause()  # until SIGKILL: no exit hook of any kind runs
        directory = multiprocess.multiprocess_dir()
        assert directory is not None
        multiprocess.mark_process_dead(os.getpid(), directory)
    except BaseException:  # noqa: BLE001 - a child must never return into the parent's code
        code = 1
    finally:
        os._exit(code)


def main() -> None:
    request: dict[str, Any] = json.load(sys.stdin)
    plan: Plan = [tuple(step) for step in request["plan"]]  # type: ignore[misc]
    children, kill = int(request["children"]), int(request["kill"])
    from shardfuse.pipeline.observability import metrics  # noqa: F401 - defined before forking, as in a pool

    read_end, write_end = os.pipe()
    pids = []
    for index in range(children):
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _child(plan, int(request["threads"]), write_end, linger=index >= children - kill)
        pids.append(pid)
    os.close(write_end)
    for _ in range(children):  # every child has counted
        assert os.read(read_end, 1) == b"x"
    for pid in pids[children - kill:]:
        os.kill(pid, signal.SIGKILL)
    statuses = [os.waitpid(pid, 0)[1] for pid in pids]
    assert all(os.waitstatus_to_exitcode(s) == 0 for s in statuses[:children - kill]), statuses
    print(json.dumps(pids))


if __name__ == "__main__":
    main()
