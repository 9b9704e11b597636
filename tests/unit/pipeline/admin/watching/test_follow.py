"""The watch loop: it publishes what settles, keeps every change through a broker outage (retried with
backoff), and on stop (Ctrl-C) publishes what is still pending before it returns."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest

from shardfuse.pipeline.admin.watching.events import FsEvent, Kind
from shardfuse.pipeline.admin.watching.follow import follow
from tests.unit.pipeline.admin.watching.harness import Harness


def _queued(h: Harness, *names: str) -> queue.Queue[FsEvent]:
    inbox: queue.Queue[FsEvent] = queue.Queue()
    for name in names:
        h.path(name).write_text(name)
        inbox.put(FsEvent(Kind.CLOSED, h.path(name)))
    return inbox


@pytest.mark.timeout(30)
def test_an_outage_is_retried_until_the_changes_are_published(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.ticking = True
    inbox = _queued(h, "a.md", "b.md")
    h.sink.failures_left = 2
    stop = threading.Event()
    said: list[str] = []
    warned: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        stop.set()  # the first batch published: stop

    totals = follow(h.watcher, inbox, stop=stop, retry_max_s=0.01, say=say, warn=warned.append)
    assert said == ["published 2 writes, 0 deletes: docs/a.md, docs/b.md"]
    assert len(warned) == 2 and all(w.startswith("cannot publish to the broker") for w in warned)
    assert "2 change(s) kept" in warned[0]
    assert (totals.writes, totals.deletes, totals.unpublished_at_stop) == (2, 0, 0)
    # The events were made once and held through the outage: each path published once.
    assert sorted(e.path for e in h.sink.published) == ["docs/a.md", "docs/b.md"] and not h.sink.held


def test_stop_publishes_what_is_pending_even_unsettled(tmp_path: Path) -> None:
    h = Harness(tmp_path)  # the clock stands still: nothing would ever settle
    inbox = _queued(h, "a.md")
    stop = threading.Event()
    stop.set()  # Ctrl-C at once
    said: list[str] = []
    totals = follow(h.watcher, inbox, stop=stop, retry_max_s=0.01, say=said.append, warn=said.append)
    assert said == ["published 1 write, 0 deletes: docs/a.md"]
    assert totals.writes == 1 and h.watcher.pending == 0


def test_stop_during_an_outage_says_how_many_changes_were_not_published(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    inbox = _queued(h, "a.md", "b.md")
    h.sink.outage = True
    stop = threading.Event()
    stop.set()
    slept: list[float] = []
    warned: list[str] = []
    totals = follow(h.watcher, inbox, stop=stop, retry_max_s=0.01, say=warned.append, warn=warned.append,
                    final_attempts=3, final_wait_s=1.0, sleep=slept.append)
    assert slept == [1.0, 1.0] and len(warned) == 2  # three tries, two waits
    assert totals.unpublished_at_stop == 2 and totals.writes == 0
