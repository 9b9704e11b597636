"""Poll a component until it answers, or fail with an error that says where to look."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from shardfuse.workers.stack.errors import StackError

POLL_INTERVAL_S = 0.25


def wait_ready(
    name: str,
    ready: Callable[[], bool],
    *,
    deadline: float,
    log: Path,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Call ``ready`` until it returns True; raise StackError at ``deadline`` (a ``time.monotonic`` value).

    ``alive`` lets a component that crashed during start-up fail at once instead of at the deadline.
    """
    while True:
        if ready():
            return
        if alive is not None and not alive():
            raise StackError(f"{name} exited during start-up; see its log at {log}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StackError(f"{name} is not ready (timed out waiting for it); see its log at {log}")
        time.sleep(min(POLL_INTERVAL_S, remaining))
