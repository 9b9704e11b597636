"""Per-document deadlines: a time budget that the work on one document runs against.

The ingest stage starts a :class:`Deadline` for each document (``ingest.document_deadline_s``) and makes it
the *current* one of its thread (:func:`running_within`, a context variable, so each document's thread has
its own). Long pure loops (chunkers, the entropy filter) call :func:`checkpoint` now and then, which raises
:class:`~shardfuse.pipeline.core.errors.DeadlineExceededError` once the time is spent; code that blocks (a
CAS read, a chat request) asks :func:`current` for what remains and waits no longer than that
(:func:`call_within` for a call that takes no timeout of its own, which fails with the transient
:class:`~shardfuse.pipeline.core.errors.DocumentStuckError`: a blocked read is the store's fault). The work
itself stays plain code: it never receives the deadline as an argument, as with anyio's ``fail_after`` scopes.

A call that no checkpoint can interrupt (one long C call) is caught by whoever waits for the document's
thread (:mod:`shardfuse.pipeline.ingest.message`): it stops waiting once the deadline and a grace period
have passed and reports the document as stuck (transient: retried, as any store outage is).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

from shardfuse.pipeline.core.errors import DeadlineExceededError, DocumentStuckError

T = TypeVar("T")

_CURRENT: ContextVar[Deadline | None] = ContextVar("shardfuse_deadline", default=None)


@dataclass(frozen=True, slots=True)
class Deadline:
    """``budget_s`` seconds from ``started`` on ``clock`` (monotonic), for the work named ``what``."""

    budget_s: float
    what: str = "the document"
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    started: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if self.started < 0:
            object.__setattr__(self, "started", self.clock())

    @property
    def remaining_s(self) -> float:
        """Seconds left (negative once past)."""
        return self.started + self.budget_s - self.clock()

    @property
    def expired(self) -> bool:
        return self.remaining_s <= 0

    def error(self, doing: str) -> DeadlineExceededError:
        """The error of work that ran past this deadline while ``doing`` (``"chunking"``)."""
        return DeadlineExceededError(
            f"{self.what} ran past its {self.budget_s:g}s deadline (ingest.document_deadline_s) while {doing}; "
            "the same content would overrun again: make it smaller or simpler, or raise the deadline, then retry "
            "this dead letter")

    def check(self, doing: str) -> None:
        """:class:`DeadlineExceededError` if the time is spent."""
        if self.expired:
            raise self.error(doing)

    def timeout_s(self, cap_s: float, doing: str) -> float:
        """The timeout for one blocking call: ``cap_s``, or what remains if that is less. Raises when nothing
        remains."""
        remaining = self.remaining_s
        if remaining <= 0:
            raise self.error(doing)
        return min(cap_s, remaining)


def current() -> Deadline | None:
    """The deadline this thread's work runs against, if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def running_within(deadline: Deadline | None) -> Iterator[Deadline | None]:
    """Make ``deadline`` the current one for the block (None: no deadline)."""
    token = _CURRENT.set(deadline)
    try:
        yield deadline
    finally:
        _CURRENT.reset(token)


def checkpoint(doing: str) -> None:
    """Raise :class:`DeadlineExceededError` if the current deadline (if any) is spent. Cheap (one context
    variable read and a clock read): long loops call it every few hundred steps."""
    deadline = _CURRENT.get()
    if deadline is not None and deadline.expired:
        raise deadline.error(doing)


def call_within(fn: Callable[[], T], doing: str) -> T:
    """``fn()``, waited for no longer than the current deadline leaves.

    Without a current deadline, ``fn`` runs on this thread. Otherwise it runs on a daemon thread
    and a call that has not returned in time raises :class:`DocumentStuckError` here; the thread is left
    to finish on its own (a read blocked on a hung filesystem cannot be interrupted from Python), and what it
    returns then is dropped. Use it only for calls without side effects (reads).
    """
    deadline = _CURRENT.get()
    if deadline is None:
        return fn()
    wait_s = deadline.timeout_s(float("inf"), doing)
    outcome: list[tuple[bool, object]] = []
    finished = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which raises it
            outcome.append((False, exc))
        finally:
            finished.set()

    threading.Thread(target=run, name="deadline-call", daemon=True).start()
    if not finished.wait(wait_s):
        raise DocumentStuckError(f"{deadline.what} was still {doing} when its {deadline.budget_s:g}s deadline "
                                 "(ingest.document_deadline_s) passed; a blocked read is the store's fault, not the "
                                 "content's: retried")
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]
