"""The documents of one message worked on a few at a time, each on a thread of its own, and given up on when
its thread does not come back in time.

Each document's events run in order on one thread (:func:`run_groups`). Its work checks its deadline
cooperatively (:mod:`shardfuse.pipeline.core.deadline`) and fails with
:class:`~shardfuse.pipeline.core.errors.DeadlineExceededError` soon after the deadline passes. A thread stuck
where no check reaches (a read from a hung filesystem, one long native call) is waited for until its
deadline and :data:`GRACE_S` more have passed, then reported as stuck
(:class:`~shardfuse.pipeline.core.errors.DocumentStuckError`, transient: retried) and abandoned, so that its
siblings complete and the message is settled before the task's time limits.

An abandoned thread may still finish later. Nothing it can do then corrupts anything: its result is
dropped (a prepared document never reaches the embed stage); the only writes it can still make are a
skip or a tombstone for *its own* event, which the shard applies only if that event's seq is newer than
what the shard holds (so the write is what running the event once does) and only under a fencing token
no older than the current holder's (so a later run of the document that took over the lease is never
overwritten); and it holds the document's lease until it returns, so no other run of that document starts
on the strength of the abandoned one. A redelivered or retried copy of the event is then a no-op.
"""

from __future__ import annotations

import contextvars
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from shardfuse.pipeline.core.errors import DocumentStuckError
from shardfuse.pipeline.core.events import WriteEvent
from shardfuse.pipeline.ingest.stage import IngestOutcome

log = logging.getLogger(__name__)

# A thread still busy this long after its deadline is given up on: a cooperative check raises within
# milliseconds of the deadline, so only a call no check reaches takes longer.
GRACE_S = 2.0
# Threads kept waiting for the next document's work (a message works on a few documents at a time).
IDLE_THREADS = 8

Group = list[tuple[Any, WriteEvent]]
Done = tuple[Any, WriteEvent, IngestOutcome | BaseException]


def run_groups(groups: list[Group], one: Callable[[Group], list[Done]], *, threads: int,
               deadline_s: float | None, grace_s: float = GRACE_S,
               clock: Callable[[], float] = time.monotonic) -> list[Done]:
    """``one`` over every group, up to ``threads`` groups at a time, results in group order.

    With ``deadline_s`` (each event's deadline), a group still running ``len(group) * deadline_s +
    grace_s`` after it started is given up on: each of its events fails with
    :class:`DocumentStuckError`. Without it, a single group (or ``threads <= 1``) runs on this thread.
    """
    if deadline_s is None and (len(groups) <= 1 or threads <= 1):
        return [done for group in groups for done in one(group)]
    results: list[list[Done]] = [[] for _ in groups]
    finished: queue.SimpleQueue[tuple[int, list[Done]]] = queue.SimpleQueue()
    give_up_at: dict[int, float] = {}
    started = 0
    while started < len(groups) or give_up_at:
        while started < len(groups) and len(give_up_at) < max(threads, 1):
            _start(started, groups[started], one, finished)
            budget = math.inf if deadline_s is None else len(groups[started]) * deadline_s + grace_s
            give_up_at[started] = clock() + budget
            started += 1
        first = min(give_up_at.values())
        try:
            index, done = finished.get(timeout=None if math.isinf(first) else max(0.0, first - clock()))
        except queue.Empty:
            now = clock()
            for index in [i for i, at in give_up_at.items() if at <= now]:
                del give_up_at[index]
                results[index] = _overrun(groups[index], deadline_s or 0.0, grace_s)
            continue
        if give_up_at.pop(index, None) is not None:  # else: given up on already; its late result is dropped
            results[index] = done
    return [done for group_results in results for done in group_results]


def _start(index: int, group: Group, one: Callable[[Group], list[Done]],
           finished: queue.SimpleQueue[tuple[int, list[Done]]]) -> None:
    # The work runs in a copy of the caller's context: its log context (task, task id) carries over.
    context = contextvars.copy_context()

    def run() -> None:
        try:
            done = context.run(one, group)
        except BaseException as exc:  # noqa: BLE001 - whatever ends the work is each event's failure
            done = [(raw, event, exc) for raw, event in group]
        finished.put((index, done))

    _THREADS.run(run)


class _Threads:
    """Daemon threads that each run one document's work and then wait for the next. Starting a thread per
    document cost ~115 µs of CPU here against ~33 µs to hand work to a waiting one (``threading`` has no
    pool that can leave a thread behind: ``concurrent.futures`` joins its workers at exit and cannot give
    up on one). A thread given up on rejoins the waiting ones only when its work returns; at most
    :data:`IDLE_THREADS` wait, the others end."""

    def __init__(self) -> None:
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._lock = threading.Lock()

    def run(self, work: Callable[[], None]) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            # A daemon: a thread given up on must not keep the process from exiting.
            threading.Thread(target=self._serve, args=(inbox,), name="ingest-document", daemon=True).start()
        inbox.put(work)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            inbox.get()()
            with self._lock:
                if len(self._idle) >= IDLE_THREADS:
                    return
                self._idle.append(inbox)


_THREADS = _Threads()


def _overrun(group: Group, deadline_s: float, grace_s: float) -> list[Done]:
    _, first = group[0]
    log.error("[%s] %s: still being worked on %gs past its deadline (%d event(s) of %gs each); given up on, "
              "its thread left to finish on its own", first.zone, first.path, grace_s, len(group), deadline_s)
    # Transient: what no deadline check reaches is a blocked call (a database that is down, a hung
    # filesystem), not the content; the retry budget dead-letters the document if the block lasts.
    return [(raw, event, DocumentStuckError(
        f"[{event.zone}] {event.path} ran past its {deadline_s:g}s deadline (ingest.document_deadline_s) and "
        f"did not come back within {grace_s:g}s more: given up on (blocked in a call no deadline check reaches, "
        "such as a wait for a store that is down or a read from a hung filesystem); retried"))
        for raw, event in group]
