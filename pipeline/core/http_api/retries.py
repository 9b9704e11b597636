"""The one retry policy for calls to hosted APIs (embedding providers, chat models), on tenacity.

Only :class:`TransientError` is retried (the adapters translate 429s, 5xx, timeouts and connection resets
into it); a :class:`PermanentError`, or any exception outside our tree, is raised at once. Waits are
exponential with full jitter, so workers that failed together do not retry together, but never shorter
than the wait the server asked for (a 429's or 503's ``Retry-After``, carried as the error's
``retry_after_s``). No retry starts whose wait would carry the call past ``max_retry_s``: the last error
is raised instead, and the caller decides what a failure costs (a Celery retry, a chunk without context,
a search without expansion).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from shardfuse.pipeline.core.errors import RateLimitedError, TransientError
from shardfuse.pipeline.observability import metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

# Full-jitter backoff: attempt n waits uniformly in [0, min(INITIAL_WAIT_S * 2**(n-1), MAX_WAIT_S)].
INITIAL_WAIT_S = 0.5
MAX_WAIT_S = 30.0
# A Retry-After wait is stretched by up to this fraction, so the workers a 429 stopped together do not
# all come back in the same instant.
RETRY_AFTER_JITTER = 0.1


def is_rate_limited(exc: BaseException) -> bool:
    """True for a provider 429 (with or without a Retry-After)."""
    return isinstance(exc, RateLimitedError)


def retry_after_of(exc: BaseException | None) -> float | None:
    """The delay the server asked for, if ``exc`` carries a usable one."""
    value = getattr(exc, "retry_after_s", None)
    if isinstance(value, int | float) and value > 0:
        return float(value)
    return None


class _WaitAtLeastRetryAfter(wait_base):
    """The backoff's wait, or the server's Retry-After (slightly jittered upward) if that is longer."""

    def __init__(self, backoff: wait_base) -> None:
        self._backoff = backoff

    def __call__(self, retry_state: RetryCallState) -> float:
        wait = float(self._backoff(retry_state))
        retry_after = retry_after_of(_error_of(retry_state))
        if retry_after is not None:
            wait = max(wait, retry_after * (1 + random.uniform(0, RETRY_AFTER_JITTER)))
        return wait


class _StopBeforeBudget(stop_base):
    """Stop when the next wait would end past ``max_retry_s`` since the first attempt, on ``clock``.

    tenacity's own ``stop_before_delay`` reads ``time.monotonic`` directly; this takes the clock so that
    tests can check the budget without sleeping.
    """

    def __init__(self, max_retry_s: float, *, clock: Callable[[], float]) -> None:
        self._max_retry_s = max_retry_s
        self._clock = clock
        self._started = clock()

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._clock() - self._started + retry_state.upcoming_sleep > self._max_retry_s


def call_with_retries(
    fn: Callable[[], T],
    *,
    max_retry_s: float,
    on_rate_limited: Callable[[float | None], None] | None = None,
    max_attempts: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    initial_wait_s: float = INITIAL_WAIT_S,
    max_wait_s: float = MAX_WAIT_S,
    provider: str = "unknown",
) -> T:
    """``fn()``, retried on :class:`TransientError` for at most ``max_retry_s`` in all (and at most
    ``max_attempts`` attempts, when given); the last error is re-raised when the budget is spent.

    ``on_rate_limited(retry_after_s)`` hears of every 429, including the last one, so a backpressure layer
    can slow down. 429s and retries are counted under ``provider``
    (:data:`~shardfuse.pipeline.observability.metrics.PROVIDER_RATE_LIMITED`,
    :data:`~shardfuse.pipeline.observability.metrics.PROVIDER_RETRIES`).
    """

    def after_attempt(retry_state: RetryCallState) -> None:
        exc = _error_of(retry_state)
        if exc is not None and is_rate_limited(exc):
            metrics.inc(metrics.PROVIDER_RATE_LIMITED, provider=provider)
            if on_rate_limited is not None:
                on_rate_limited(retry_after_of(exc))

    def before_sleep(retry_state: RetryCallState) -> None:
        metrics.inc(metrics.PROVIDER_RETRIES, provider=provider)
        exc = _error_of(retry_state)
        log.warning("%s attempt %d failed (%s: %s); retrying in %.2fs", provider, retry_state.attempt_number,
                    type(exc).__name__, exc, retry_state.upcoming_sleep)  # fmt: skip

    stop: stop_base = _StopBeforeBudget(max_retry_s, clock=clock)
    if max_attempts is not None:
        stop = stop | stop_after_attempt(max_attempts)
    retrying = Retrying(
        retry=retry_if_exception_type(TransientError),
        wait=_WaitAtLeastRetryAfter(wait_random_exponential(multiplier=initial_wait_s, max=max_wait_s)),
        stop=stop,
        after=after_attempt,
        before_sleep=before_sleep,
        sleep=sleep,
        reraise=True,
    )
    return retrying(fn)


def _error_of(retry_state: RetryCallState) -> BaseException | None:
    return retry_state.outcome.exception() if retry_state.outcome is not None else None
