"""Backpressure for remote embedding providers: many worker processes, one provider quota.

Three layers, from the inside out:

- :class:`AdaptiveLimit` (pure, per process): AIMD concurrency. It starts at ``embedder.max_concurrent``,
  halves on a 429 (once per congestion window, so one burst of 429s from requests that were already in
  flight counts as one signal) and grows by one after as many consecutive successes as the current limit
  (about one step per round of requests, as TCP does per round trip).
- :class:`~shardfuse.pipeline.embed.limiters.global_limiter.GlobalLimiter` (Redis, shared by every embed worker of one
  provider and model): concurrency, per-minute budgets and a shared ``Retry-After`` pause.
- :class:`Backpressure`: what the embed batcher uses. ``with backpressure.request(tokens, timeout_s=...)``
  waits for a per-process slot (at the AIMD limit) and then a global lease; ``record(outcome)`` teaches
  the AIMD and, on a 429 with ``Retry-After``, pauses every worker.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from redis import Redis

from shardfuse.pipeline.config.settings import EmbedderSettings
from shardfuse.pipeline.core.errors import BackpressureTimeout, TransientError
from shardfuse.pipeline.embed.limiters.global_limiter import LEASE_MARGIN_S, GlobalLimiter, Lease

__all__ = [
    "LEASE_MARGIN_S", "AdaptiveLimit", "Backpressure", "GlobalLimiter", "Lease", "Outcome", "OutcomeKind",
    "build_backpressure",
]  # fmt: skip

log = logging.getLogger(__name__)


# -- outcomes and the AIMD limit (pure) ------------------------------------------------------------------
class OutcomeKind(enum.Enum):
    SUCCESS = "success"
    RATE_LIMITED = "rate_limited"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one provider request ended; ``retry_after_s`` only for a 429 whose response said how long."""

    kind: OutcomeKind
    retry_after_s: float | None = None

    @classmethod
    def success(cls) -> Outcome:
        return cls(OutcomeKind.SUCCESS)

    @classmethod
    def rate_limited(cls, retry_after_s: float | None = None) -> Outcome:
        return cls(OutcomeKind.RATE_LIMITED, retry_after_s)

    @classmethod
    def failed(cls) -> Outcome:
        return cls(OutcomeKind.FAILED)


class AdaptiveLimit:
    """AIMD concurrency for one process: ``1 <= current <= maximum`` at all times. Thread-safe.

    A 429 halves the limit, but only once per ``cooldown_s``: requests sent before the decrease keep
    coming back 429 for a while, and each of them is the same congestion signal, not a new one. Ending the
    window at the next success instead would let one of those old requests succeed and the next old one
    halve the limit again. Any other failure (5xx, timeout) says nothing about the quota: it only breaks
    the run of successes that growth waits for.
    """

    def __init__(self, maximum: int, *, cooldown_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        if maximum < 1:
            raise ValueError(f"maximum must be at least 1, not {maximum}")
        self._maximum = maximum
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._current = maximum
        self._successes = 0
        self._last_decrease = -math.inf

    @property
    def maximum(self) -> int:
        return self._maximum

    @property
    def current(self) -> int:
        return self._current

    def on_success(self) -> int:
        """Count a success; after ``current`` of them in a row the limit grows by one. Returns the limit."""
        with self._lock:
            self._successes += 1
            if self._successes >= self._current:
                self._successes = 0
                self._current = min(self._maximum, self._current + 1)
            return self._current

    def on_rate_limited(self) -> int:
        """Halve the limit (not below 1) unless it was already halved within ``cooldown_s``."""
        with self._lock:
            self._successes = 0
            now = self._clock()
            if now - self._last_decrease >= self._cooldown_s:
                self._last_decrease = now
                self._current = max(1, self._current // 2)
            return self._current

    def on_failure(self) -> int:
        with self._lock:
            self._successes = 0
            return self._current


# -- what the embed batcher uses -------------------------------------------------------------------------
class Backpressure:
    """A per-process slot at the AIMD limit, then a global lease; ``record`` feeds the outcome back.

    Threads, not asyncio: embed workers run a thread pool, and a resizable limit needs a condition
    variable rather than a fixed-size semaphore. Async callers can use ``asyncio.to_thread``.
    """

    def __init__(self, *, limit: AdaptiveLimit, global_limiter: GlobalLimiter) -> None:
        self._limit = limit
        self._global = global_limiter
        self._changed = threading.Condition()
        self._in_flight = 0

    @property
    def limit(self) -> AdaptiveLimit:
        return self._limit

    @property
    def in_flight(self) -> int:
        """Requests of this process inside :meth:`request` right now."""
        return self._in_flight

    @contextmanager
    def request(self, tokens: int, *, timeout_s: float) -> Iterator[Lease]:
        """Hold a slot for one provider request of ``tokens`` input tokens; waits at most ``timeout_s``
        in all, then raises :class:`~shardfuse.pipeline.core.errors.BackpressureTimeout`. Hold it only around
        the provider call itself."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._in_flight >= self._limit.current:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BackpressureTimeout(
                        f"no embedding request slot within {timeout_s:g}s: this process already has "
                        f"{self._in_flight} requests in flight (adaptive limit {self._limit.current})"
                    )
                self._changed.wait(remaining)
            self._in_flight += 1
        try:
            with self._global.lease(tokens, timeout_s=max(0.0, deadline - time.monotonic())) as lease:
                yield lease
        finally:
            with self._changed:
                self._in_flight -= 1
                self._changed.notify()

    def record(self, outcome: Outcome) -> None:
        """Teach the limits how a request ended; a 429's Retry-After pauses every worker."""
        match outcome.kind:
            case OutcomeKind.SUCCESS:
                self._limit.on_success()
            case OutcomeKind.RATE_LIMITED:
                self._limit.on_rate_limited()
                if outcome.retry_after_s:
                    self._pause_everyone(outcome.retry_after_s)
            case OutcomeKind.FAILED:
                self._limit.on_failure()
        with self._changed:
            # The limit may have grown: let waiting threads re-check.
            self._changed.notify_all()

    def on_rate_limited(self, retry_after_s: float | None) -> None:
        """``record(Outcome.rate_limited(retry_after_s))``, shaped for ``call_with_retries``."""
        self.record(Outcome.rate_limited(retry_after_s))

    def _pause_everyone(self, delay_s: float) -> None:
        try:
            self._global.pause_for(delay_s)
        except TransientError as exc:
            # The pause only spares the other workers some 429s; this call's retry still waits.
            log.warning("could not share a %.1fs provider pause: %s", delay_s, exc)


def build_backpressure(settings: EmbedderSettings, client: Redis) -> Backpressure:
    """The backpressure ``settings`` describe, sharing its global budgets through ``client``."""
    limiter = GlobalLimiter(
        client,
        provider=settings.provider.value,
        model=settings.model,
        max_concurrent=settings.global_max_concurrent,
        lease_ttl_s=settings.request_timeout_s + LEASE_MARGIN_S,
        requests_per_minute=settings.requests_per_minute,
        tokens_per_minute=settings.tokens_per_minute,
    )
    return Backpressure(limit=AdaptiveLimit(settings.max_concurrent), global_limiter=limiter)
