"""The debouncer: a burst of events on one path is one look at it, once the path is quiet (time injected)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardfuse.pipeline.admin.watching.debouncer import Debouncer
from shardfuse.pipeline.admin.watching.events import Touched

A, B = Path("/w/a.md"), Path("/w/b.md")


def test_a_burst_on_one_path_settles_once_after_the_quiet_period() -> None:
    bounce = Debouncer(settle_s=0.25, max_delay_s=2.0)
    for t in (0.0, 0.1, 0.2, 0.3):  # an editor writing in pieces
        bounce.add(Touched(A), t)
    assert bounce.due(0.5) == []  # 0.2 s after the last event: not yet
    assert bounce.wake_in(0.5) == pytest.approx(0.05)
    assert bounce.due(0.55) == [Touched(A)]
    assert bounce.due(10.0) == [] and len(bounce) == 0 and bounce.wake_in(10.0) is None


def test_each_path_settles_on_its_own() -> None:
    bounce = Debouncer(settle_s=0.25, max_delay_s=2.0)
    bounce.add(Touched(A), 0.0)
    bounce.add(Touched(B), 0.2)
    assert bounce.due(0.3) == [Touched(A)]
    assert bounce.due(0.45) == [Touched(B)]


def test_a_path_that_never_goes_quiet_is_still_published_every_max_delay() -> None:
    bounce = Debouncer(settle_s=0.25, max_delay_s=1.0)
    t = 0.0
    while t < 0.95:
        bounce.add(Touched(A), t)
        assert bounce.due(t) == []
        t += 0.1
    bounce.add(Touched(A), 1.0)
    assert bounce.due(1.0) == [Touched(A)]


def test_a_directory_flag_sticks_and_drain_takes_everything() -> None:
    bounce = Debouncer(settle_s=0.25, max_delay_s=2.0)
    bounce.add(Touched(A), 0.0)
    bounce.add(Touched(A, is_directory=True), 0.1)
    bounce.add(Touched(B), 0.1)
    assert bounce.drain() == [Touched(A, is_directory=True), Touched(B)]
    assert len(bounce) == 0


def test_put_back_paths_are_due_at_once_and_merge_with_newer_events() -> None:
    bounce = Debouncer(settle_s=0.25, max_delay_s=2.0)
    bounce.add(Touched(B), 5.0)  # an event that arrived while a publish of A and B was failing
    bounce.put_back([Touched(A), Touched(B, is_directory=True)], 5.0)
    assert bounce.wake_in(5.0) == 0.0
    assert bounce.due(5.0) == [Touched(A), Touched(B, is_directory=True)]
