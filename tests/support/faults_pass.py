"""The fault-injection tests as ``make test`` runs them: in the background, beside lint and the main suite.

A shell starts a background command with SIGINT ignored, and Python keeps an inherited ignored SIGINT ignored:
run as a plain ``pytest … &``, these tests would go on after Ctrl-C, and lint's failure could not stop them.
Here SIGINT and SIGTERM (which ``make test`` sends when lint fails or it is interrupted) both raise
KeyboardInterrupt before pytest starts, so the running test stops and pytest tears down its stack. (A SIGTERM
that comes before that, while Python is still starting, ends the process before any stack exists.)
Arguments are pytest's, after the fault-test selection.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str]) -> int:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    return int(pytest.main(["-p", "no:cacheprovider", "-m", "faults", "tests/integration/faults", *argv]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
