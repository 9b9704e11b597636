"""The retry policy of every hosted API call, on a fake clock: what is retried, how long it waits, when it gives up."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shardfuse.pipeline.core.errors import (
    ContentNotFoundError,
    EmbeddingProviderError,
    EmbeddingRequestError,
    RateLimitedError,
    StoreUnavailableError,
)
from shardfuse.pipeline.core.http_api import call_with_retries, is_rate_limited, retry_after_of


class FakeTime:
    """One clock for the policy and the calls: sleeping advances it, so does each attempt."""

    def __init__(self, *, attempt_s: float = 0.0) -> None:
        self.now = 0.0
        self.attempt_s = attempt_s
        self.sleeps: list[float] = []
        self.rate_limited: list[float | None] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def failing(self, *errors: BaseException, result: object = "vectors") -> Callable[[], object]:
        """A call that raises ``errors`` in turn, then returns ``result``; counts its attempts."""
        pending = list(errors)
        self.attempts = 0

        def call() -> object:
            self.attempts += 1
            self.now += self.attempt_s
            if pending:
                raise pending.pop(0)
            return result

        return call

    def run(self, fn: Callable[[], object], *, max_retry_s: float = 60.0, max_attempts: int | None = None) -> object:
        return call_with_retries(fn, max_retry_s=max_retry_s, on_rate_limited=self.rate_limited.append,
                                 sleep=self.sleep, clock=self.clock, max_attempts=max_attempts)


def test_transient_errors_are_retried_until_the_call_succeeds() -> None:
    time = FakeTime()
    fn = time.failing(EmbeddingProviderError("503"), StoreUnavailableError("redis is down"))
    assert time.run(fn) == "vectors"
    assert time.attempts == 3 and len(time.sleeps) == 2
    assert time.rate_limited == []  # neither was a 429


@pytest.mark.parametrize("error", [EmbeddingRequestError("401: bad key", status=401), ContentNotFoundError("x"),
                                   ValueError("a bug")])
def test_permanent_and_foreign_errors_are_not_retried(error: Exception) -> None:
    time = FakeTime()
    with pytest.raises(type(error)) as raised:
        time.run(time.failing(error))
    assert raised.value is error
    assert time.attempts == 1 and time.sleeps == []


@pytest.mark.parametrize("retry_after_s", [0.001, 7.0, 25.0])
def test_a_retry_after_is_waited_at_least_and_reported(retry_after_s: float) -> None:
    time = FakeTime()
    errors = [RateLimitedError("429", retry_after_s=retry_after_s) for _ in range(3)]
    assert time.run(time.failing(*errors), max_retry_s=120.0) == "vectors"
    assert len(time.sleeps) == 3 and all(wait >= retry_after_s for wait in time.sleeps)
    assert time.rate_limited == [retry_after_s] * 3


def test_a_429_without_retry_after_backs_off_and_is_reported() -> None:
    time = FakeTime()
    assert time.run(time.failing(RateLimitedError("429"))) == "vectors"
    assert time.rate_limited == [None]
    assert 0 <= time.sleeps[0] <= 0.5  # the first full-jitter window


def test_the_retry_budget_bounds_the_total_time_and_the_last_error_is_raised() -> None:
    time = FakeTime(attempt_s=1.0)
    errors = [EmbeddingProviderError(f"503 #{n}") for n in range(1000)]
    with pytest.raises(EmbeddingProviderError) as raised:
        time.run(time.failing(*errors), max_retry_s=30.0)
    assert raised.value is errors[time.attempts - 1]
    assert time.attempts > 3
    # No wait ever ends past the budget; only the attempt that follows the last wait can end after it.
    assert time.now <= 30.0 + time.attempt_s


def test_a_retry_after_beyond_the_budget_gives_up_at_once_but_still_reports_the_429() -> None:
    time = FakeTime()
    error = RateLimitedError("429", retry_after_s=600.0)
    with pytest.raises(RateLimitedError) as raised:
        time.run(time.failing(error), max_retry_s=120.0)
    assert raised.value is error
    assert time.sleeps == [] and time.rate_limited == [600.0]


def test_a_503s_wait_is_honoured_without_reporting_a_rate_limit() -> None:
    time = FakeTime()
    assert time.run(time.failing(EmbeddingProviderError("503", retry_after_s=4.0))) == "vectors"
    assert 4.0 <= time.sleeps[0] <= 4.4 and time.rate_limited == []


def test_max_attempts_stops_before_the_budget_does() -> None:
    time = FakeTime()
    errors = [EmbeddingProviderError(f"503 #{n}") for n in range(5)]
    with pytest.raises(EmbeddingProviderError) as raised:
        time.run(time.failing(*errors), max_attempts=2)
    assert raised.value is errors[1] and time.attempts == 2 and len(time.sleeps) == 1


def test_rate_limits_are_recognised_by_their_retry_after_attribute() -> None:
    assert is_rate_limited(RateLimitedError("429")) and not is_rate_limited(EmbeddingProviderError("503"))
    assert retry_after_of(RateLimitedError("429", retry_after_s=2)) == 2.0
    assert retry_after_of(EmbeddingProviderError("503", retry_after_s=1.5)) == 1.5
    assert retry_after_of(RateLimitedError("429")) is None and retry_after_of(ValueError()) is None
