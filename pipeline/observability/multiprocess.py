"""One pool's metrics across its processes: ``prometheus_client``'s multiprocess directory.

A Celery prefork pool is a main process and children it forks (and replaces when one dies). In
multiprocess mode every process that counts writes its values to files of its own in the pool's directory
(``PROMETHEUS_MULTIPROC_DIR``, named ``<type>_<pid>.db``); :func:`pool_registry` adds every file up at each
scrape, so the pool serves one ``/metrics`` whose counters are the exact sums over its processes, the dead
ones included (their files stay). The directory belongs to one pool on one host:

- it is emptied when the pool starts (:func:`clean_directory`, before the main process forks): counters then
  restart from 0, which Prometheus's ``rate()`` and ``increase()`` read as the reset of a restarted process,
  as they would for any single process;
- :func:`mark_process_dead` is called as each child exits; it removes the files of "live" gauges only
  (counters and histograms of a finished process still count), so a child killed outright loses nothing.

Two pools sharing one directory would empty each other's at start: each pool gets its own (the embedded
stack ``<data_dir>/run/metrics/<queue>``, a container its own ``/tmp``). A pool whose children are replaced
often (``max_tasks_per_child``) leaves a file per child until it restarts, which costs each scrape a little
more; shardfuse does not recycle children.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client import multiprocess as _multiprocess

# The variable prometheus_client reads, once, when it is imported: it must be in the process's environment
# from the start (the launcher puts it in the child's), never written by the process itself.
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The directory this process counts into (``PROMETHEUS_MULTIPROC_DIR`` of ``environ``, by default this
    process's environment); None when it counts in memory (single-process mode)."""
    value = (os.environ if environ is None else environ).get(MULTIPROC_DIR_ENV, "")
    return Path(value) if value else None


def clean_directory(path: Path) -> int:
    """Create ``path`` if needed and remove the files a previous run of the pool left; returns how many.
    Call it in the pool's main process before any process counts (before the pool forks)."""
    path.mkdir(parents=True, exist_ok=True)
    removed = 0
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)
        removed += 1
    return removed


def pool_registry(path: Path | None) -> CollectorRegistry:
    """What a pool's ``/metrics`` serves: the sum of every file under ``path`` (multiprocess mode), or, with
    no directory, this process's default registry (a pool whose tasks all run in its main process)."""
    if path is None:
        return REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    _multiprocess.MultiProcessCollector(registry, path=str(path))  # type: ignore[no-untyped-call]  # untyped upstream
    return registry


def mark_process_dead(pid: int, path: Path) -> None:
    """Tell the directory that process ``pid`` has ended (its live gauges stop counting)."""
    _multiprocess.mark_process_dead(pid, str(path))  # type: ignore[no-untyped-call]  # untyped upstream
