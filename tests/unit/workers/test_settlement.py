"""What becomes of failed work (shardfuse.workers.tasks.settlement): dead letter, retry or wait, and the
backoff before a retry."""

from __future__ import annotations

import random

import pytest

from shardfuse.pipeline.core.errors import (
    ContentNotFoundError,
    DocumentBusyError,
    InvalidEventError,
    LeaseLostError,
    StoreUnavailableError,
)
from shardfuse.workers.tasks.settlement import MAX_BACKOFF_S, Verdict, retry_countdown, settle, verdict


@pytest.mark.parametrize(
    ("error", "attempts", "expected"),
    [
        (InvalidEventError("bad"), 1, Verdict.DEAD_LETTER),  # permanent: at once, budget or not
        (ContentNotFoundError("gone"), 1, Verdict.DEAD_LETTER),
        (StoreUnavailableError("down"), 1, Verdict.RETRY),
        (StoreUnavailableError("down"), 2, Verdict.RETRY),  # its retry is the last the budget allows
        (StoreUnavailableError("down"), 3, Verdict.DEAD_LETTER),  # the budget (2 retries) is spent
        (LeaseLostError("fenced"), 2, Verdict.RETRY),
        (TimeoutError(), 1, Verdict.RETRY),  # not ours (a timeout, a bug): transient within the budget
        (KeyError("x"), 3, Verdict.DEAD_LETTER),
        (DocumentBusyError("held"), 1, Verdict.WAIT),
        (DocumentBusyError("held"), 40, Verdict.WAIT),  # waiting spends no budget
    ],
)
def test_the_verdict_follows_the_error_family_and_the_budget(error: BaseException, attempts: int,
                                                             expected: Verdict) -> None:
    assert verdict(error, attempts=attempts, max_retries=2) is expected


def test_settle_sorts_each_item_by_its_verdict_keeping_message_order() -> None:
    bad, down, held, gone, late = (InvalidEventError("bad"), StoreUnavailableError("down"),
                                   DocumentBusyError("held"), ContentNotFoundError("gone"), ConnectionError("reset"))
    failures = [("a", bad), ("b", down), ("c", held), ("d", gone), ("e", late), ("f", held)]
    plan = settle(failures, attempts=1, max_retries=5)
    assert plan.dead == (("a", bad), ("d", gone))
    assert plan.retry == (("b", down), ("e", late))
    assert plan.wait == ("c", "f")
    # With the budget spent the transient ones are dead-lettered too; busy ones still wait.
    spent = settle(failures, attempts=6, max_retries=5)
    assert [item for item, _ in spent.dead] == ["a", "b", "d", "e"] and spent.retry == ()
    assert spent.wait == ("c", "f")


def test_nothing_failed_nothing_to_settle() -> None:
    plan = settle([], attempts=1, max_retries=5)
    assert (plan.dead, plan.retry, plan.wait) == ((), (), ())


def test_the_backoff_doubles_up_to_its_cap() -> None:
    highest = [retry_countdown(retries, draw=lambda low, high: high) for retries in range(10)]
    assert highest == [1, 2, 4, 8, 16, 32, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S]
    assert retry_countdown(10_000, draw=lambda low, high: high) == MAX_BACKOFF_S  # no overflow
    assert all(retry_countdown(retries, draw=lambda low, high: low) == 0 for retries in range(10))


def test_messages_that_failed_together_do_not_come_back_together() -> None:
    draws = [retry_countdown(5, draw=random.Random(seed).uniform) for seed in range(50)]
    assert all(0 <= wait <= 32 for wait in draws)
    assert len({round(wait, 3) for wait in draws}) > 40  # spread over the window, not one instant
