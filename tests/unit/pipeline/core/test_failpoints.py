"""Failpoints: an armed failpoint kills the first process that reaches it, by SIGKILL, exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from shardfuse.pipeline.core import failpoints
from shardfuse.pipeline.core.failpoints import Failpoint

# A child process reaches the failpoint with the marker file given as its argument (or unarmed without one),
# then says it lived on.
_CHILD = """
import sys
from pathlib import Path
from shardfuse.pipeline.core import failpoints
armed = {"after_commit": Path(sys.argv[1])} if len(sys.argv) > 1 else {}
failpoints.reach(failpoints.Failpoint.AFTER_COMMIT, armed)
print("went on")
"""


def _reach_in_child(*marker: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _CHILD, *map(str, marker)], capture_output=True, text=True,
                          timeout=60)


def test_the_first_process_to_reach_an_armed_failpoint_dies_by_sigkill_and_leaves_its_marker(tmp_path: Path) -> None:
    marker = tmp_path / "after_commit.killed"
    first = _reach_in_child(marker)
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr)
    assert "went on" not in first.stdout
    assert marker.read_text().isdigit()  # the pid of the process that died there
    assert marker.stat().st_mode & 0o777 == 0o600


def test_a_later_arrival_finds_the_marker_and_goes_on(tmp_path: Path) -> None:
    marker = tmp_path / "after_commit.killed"
    first = _reach_in_child(marker)
    killed_pid = marker.read_text()
    second = _reach_in_child(marker)
    assert first.returncode == -signal.SIGKILL
    assert (second.returncode, second.stdout.strip()) == (0, "went on"), second.stderr
    assert marker.read_text() == killed_pid  # not rewritten


def test_an_unarmed_failpoint_does_nothing(tmp_path: Path) -> None:
    unarmed = _reach_in_child()
    assert (unarmed.returncode, unarmed.stdout.strip()) == (0, "went on"), unarmed.stderr
    # In this process too: another failpoint's marker does not arm this one.
    failpoints.reach(Failpoint.AFTER_COMMIT, {"some_other_point": tmp_path / "other"})
    assert list(tmp_path.iterdir()) == []
