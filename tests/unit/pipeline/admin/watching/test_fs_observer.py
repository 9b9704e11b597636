"""The watchdog adapter on a real directory (inotify on Linux): what a program does to files arrives on the
queue as our events, and the watcher's resolution of them is what ``publish`` would publish. Bounded waits
for the kernel's events, no fixed sleeps."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import pytest

from shardfuse.pipeline.admin.watching.events import FsEvent, Kind
from shardfuse.pipeline.admin.watching.fs_observer import observing

WAIT_S = 10.0


def _until(inbox: queue.Queue[FsEvent], wanted: FsEvent) -> None:
    seen: list[FsEvent] = []
    deadline = time.monotonic() + WAIT_S
    while wanted not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"no {wanted} within {WAIT_S}s; saw {seen}")
        try:
            seen.append(inbox.get(timeout=remaining))
        except queue.Empty:
            continue


@pytest.mark.timeout(60)
def test_writes_renames_and_deletes_arrive_as_our_events(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    inbox: queue.Queue[FsEvent] = queue.Queue()
    with observing([root], inbox) as alive:
        assert alive()
        (root / "a.md").write_text("x")
        _until(inbox, FsEvent(Kind.CLOSED, root / "a.md"))
        (root / "a.md").rename(root / "b.md")
        _until(inbox, FsEvent(Kind.MOVED, root / "a.md", dest=root / "b.md"))
        (root / "d").mkdir()
        _until(inbox, FsEvent(Kind.CREATED, root / "d", is_directory=True))
        (root / "d" / "c.md").write_text("y")  # a watch on the new directory was added
        _until(inbox, FsEvent(Kind.CLOSED, root / "d" / "c.md"))
        (root / "d").rename(root / "e")
        _until(inbox, FsEvent(Kind.MOVED, root / "d", is_directory=True, dest=root / "e"))
        (root / "b.md").unlink()
        _until(inbox, FsEvent(Kind.DELETED, root / "b.md"))
    assert not alive()
