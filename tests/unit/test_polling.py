"""tests/support/polling.py: the waiting every integration test leans on returns what it waited for, and says
what it waited for when it gives up."""

from __future__ import annotations

import itertools

import pytest

from tests.support.polling import eventually


def test_the_first_truthy_value_is_returned_once_it_comes() -> None:
    answers = iter([None, 0, [], ["done"], ["later"]])
    assert eventually(lambda: next(answers), timeout=5, what="a list", interval=0.001) == ["done"]
    assert next(answers) == ["later"]  # asked no more than it had to


def test_past_the_timeout_it_fails_naming_what_it_waited_for_and_the_last_answer() -> None:
    calls = itertools.count(1)
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for the queue to drain \(last: 0\)"):
        eventually(lambda: 0 * next(calls), timeout=0.05, what="the queue to drain", interval=0.01)
    assert next(calls) > 2  # asked again and again until then


def test_an_error_the_check_raises_fails_at_once() -> None:
    calls = itertools.count(1)

    def broken() -> bool:
        next(calls)
        raise KeyError("no such row")

    with pytest.raises(KeyError, match="no such row"):
        eventually(broken, timeout=5, what="a row", interval=0.001)
    assert next(calls) == 2
