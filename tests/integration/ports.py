"""Free loopback ports for servers the tests start."""

from __future__ import annotations

import contextlib
import os
import random
import socket

# Below the kernel's ephemeral range (32768+), which concurrent clients and `bind(0)` draw from.
ALL_PORTS = (20000, 32768)
# `make test` runs pytest-xdist workers (gw0, gw1, ...) beside the fault tests' own pytest: each worker draws
# from a slot of its own, so two processes never hand out the same port before its server binds it. A pytest
# without xdist (the fault tests, a test run by hand) takes slot 0.
SLOTS = 4


def _slot_range(worker: str | None) -> tuple[int, int]:
    if not (worker and worker.startswith("gw") and worker[2:].isdigit()):
        return _slot(0)
    return _slot(1 + int(worker[2:]) % (SLOTS - 1))


def _slot(slot: int) -> tuple[int, int]:
    width = (ALL_PORTS[1] - ALL_PORTS[0]) // SLOTS
    return ALL_PORTS[0] + slot * width, ALL_PORTS[0] + (slot + 1) * width


PORT_RANGE = _slot_range(os.environ.get("PYTEST_XDIST_WORKER"))
# Every port handed out in this process: a port is only bound once its server starts, so until then another
# call could draw it again (seen: Flower's readiness probe answered by a Redis given the same port).
_ISSUED: set[int] = set()


def free_port() -> int:
    for _ in range(100):
        port = random.randrange(*PORT_RANGE)
        if port in _ISSUED:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            _ISSUED.add(port)
            return port
    raise RuntimeError(f"no free port in {PORT_RANGE}")


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports (the embedded stack's worker pools serve their
    metrics on ``stack.metrics_port`` and the ports after it)."""
    for _ in range(100):
        first = random.randrange(PORT_RANGE[0], PORT_RANGE[1] - count)
        if _ISSUED.intersection(range(first, first + count)):
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            _ISSUED.update(range(first, first + count))
            return first
    raise RuntimeError(f"no {count} consecutive free ports in {PORT_RANGE}")
