"""How many threads the local model's forward pass may use: pure arithmetic over the machine's cores.

ONNX Runtime left alone sizes its thread pool by the machine's physical cores, whatever else runs there
and however many forward passes run at once. The embed pool runs the local model one flush at a time (its
embedding stage sends one request at a time for an in-process model), and the query pool's threads share
their one session's pool; so a process's forward passes need the cores the process may run on (its CPU
affinity, e.g. a container's cpuset), divided by the passes that run at once, never more.
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """The cores this process may run on (its affinity where the OS reports one, else every core)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def model_threads(configured: int, *, cores: int, concurrent: int = 1) -> int:
    """Intra-op threads per forward pass: ``configured`` when set (> 0), else ``cores`` shared by the
    ``concurrent`` passes that run at once, at least one each."""
    if configured < 0 or cores < 1 or concurrent < 1:
        raise ValueError(f"threads {configured}, cores {cores} and concurrent passes {concurrent} must be positive")
    if configured:
        return configured
    return max(1, cores // concurrent)
