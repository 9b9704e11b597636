"""Failpoints: named instants at which a fault test makes a worker process die, once.

The fault tests kill workers from outside (``kill -9`` at a random moment), which rarely lands in a window
a few microseconds wide, such as the one between a shard commit and its BM25 bookkeeping. A failpoint
makes that instant deterministic: ``settings.failpoints`` maps a failpoint's name to a marker file, and the
first process to reach the failpoint creates the file (exclusively) and SIGKILLs itself, exactly as the
OOM killer would. Later arrivals find the file and go on. Unset (the default), a failpoint costs one dict
lookup. A settings object, not a global, arms them: only the processes launched with it can die.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)


class Failpoint(enum.StrEnum):
    # The embed stage committed documents to their shards and has not yet recorded them for BM25.
    AFTER_COMMIT = "after_commit"
    # A query worker took a search off its queue and has not answered yet (a node dying mid-query).
    SEARCH_STARTED = "search_started"


def reach(failpoint: Failpoint, armed: Mapping[str, Path]) -> None:
    """Die here with SIGKILL if ``failpoint`` is armed and no process has died at it yet."""
    marker = armed.get(failpoint.value)
    if marker is None:
        return
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.write(descriptor, str(os.getpid()).encode())
    os.close(descriptor)
    log.critical("failpoint %s: process %d kills itself (a fault test armed it)", failpoint, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
