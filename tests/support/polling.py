"""Waiting in a test for what another thread or process does: one helper on tenacity, not a loop per test."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

T = TypeVar("T")


def eventually(check: Callable[[], T], *, timeout: float, what: str, interval: float = 0.5) -> T:
    """The first truthy value ``check()`` returns, asked every ``interval`` seconds; past ``timeout`` an
    ``AssertionError`` saying what was waited for and what ``check()`` last returned. An exception ``check()``
    raises is not waited out: it fails the test at once."""

    def timed_out(state: RetryCallState) -> T:
        last = state.outcome.result() if state.outcome is not None else None
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")

    retrying = Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(interval),
                        retry=retry_if_result(operator.not_), retry_error_callback=timed_out)
    return retrying(check)
