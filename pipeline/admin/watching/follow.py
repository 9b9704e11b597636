"""The watch loop: take events off the observer's queue, publish what settles, retry what the broker
refused (with backoff, keeping every pending change), and on stop publish everything still pending."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_when_event_set,
    wait_fixed,
    wait_random_exponential,
)

from shardfuse.pipeline.admin.watching.events import FsEvent
from shardfuse.pipeline.admin.watching.watcher import Published, Watcher
from shardfuse.pipeline.core.errors import TransientError

POLL_S = 0.2  # how soon a stop request is noticed when nothing happens
_ABSORB_MAX = 10_000  # events taken off the queue between two looks at what has settled


@dataclass
class Totals:
    writes: int = 0
    deletes: int = 0
    not_published: int = 0
    unpublished_at_stop: int = 0  # changes still pending when the last flush gave up

    def add(self, batch: Published) -> None:
        self.writes += batch.writes
        self.deletes += batch.deletes
        self.not_published += len(batch.not_published)


def follow(watcher: Watcher, inbox: queue.Queue[FsEvent], *, stop: threading.Event, retry_max_s: float,
           say: Callable[[str], None], warn: Callable[[str], None], alive: Callable[[], bool] = lambda: True,
           final_attempts: int = 3, final_wait_s: float = 1.0,
           sleep: Callable[[float], None] = time.sleep) -> Totals:
    """Run until ``stop`` is set (or ``alive()`` turns false: the observer died), then flush. ``say`` gets
    one line per published batch, ``warn`` the retries and the paths left alone."""
    loop = _Loop(watcher, inbox, say=say, warn=warn)
    steady = Retrying(retry=retry_if_exception_type(TransientError), reraise=True, stop=stop_when_event_set(stop),
                      wait=wait_random_exponential(multiplier=0.5, max=retry_max_s), sleep=lambda s: _wait(stop, s),
                      before_sleep=loop.retrying)
    while not stop.is_set() and alive():
        wake = watcher.wake_in()
        _absorb(inbox, watcher, timeout=POLL_S if wake is None else min(wake, POLL_S))
        try:
            for attempt in steady:
                with attempt:
                    loop.publish(everything=False)
        except TransientError:
            break  # stopped while retrying: the last flush below tries again
    last = Retrying(retry=retry_if_exception_type(TransientError), reraise=True,
                    stop=stop_after_attempt(final_attempts), wait=wait_fixed(final_wait_s), sleep=sleep,
                    before_sleep=loop.retrying)
    try:
        for attempt in last:
            with attempt:
                loop.publish(everything=True)
    except TransientError:
        loop.totals.unpublished_at_stop = watcher.pending
    return loop.totals


class _Loop:
    def __init__(self, watcher: Watcher, inbox: queue.Queue[FsEvent], *, say: Callable[[str], None],
                 warn: Callable[[str], None]) -> None:
        self.totals = Totals()
        self._watcher = watcher
        self._inbox = inbox
        self._say = say
        self._warn = warn

    def publish(self, *, everything: bool) -> None:
        _absorb(self._inbox, self._watcher, timeout=0)  # what arrived during a back-off joins the batch
        batch = self._watcher.publish_due(everything=everything)
        if batch is None:
            return
        self.totals.add(batch)
        if batch.events:
            self._say(batch.summary())
        for name, reason in batch.not_published.items():
            self._warn(f"not published: {name}: {reason}")

    def retrying(self, state: RetryCallState) -> None:
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        failure = state.outcome.exception() if state.outcome is not None else None
        self._warn(f"{failure}; {self._watcher.pending} change(s) kept, retrying in {wait:.1f}s")


def _wait(stop: threading.Event, seconds: float) -> None:
    stop.wait(seconds)


def _absorb(inbox: queue.Queue[FsEvent], watcher: Watcher, *, timeout: float) -> None:
    """Hand queued events to the watcher, waiting up to ``timeout`` for the first."""
    try:
        event = inbox.get(timeout=timeout) if timeout > 0 else inbox.get_nowait()
    except queue.Empty:
        return
    watcher.observe(event)
    for _ in range(_ABSORB_MAX):
        try:
            watcher.observe(inbox.get_nowait())
        except queue.Empty:
            return
