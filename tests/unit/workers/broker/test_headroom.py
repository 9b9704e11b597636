"""Publishers stop short of the broker's maxmemory (workers/broker/headroom.py), so workers can still drain it."""

from __future__ import annotations

import pytest

from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.workers.broker.headroom import BrokerHeadroom

MIB = 2**20


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_broker_past_its_high_water_mark_refuses_new_events_and_says_why() -> None:
    memory = {"used": 800 * MIB, "max": 1024 * MIB}
    headroom = BrokerHeadroom(lambda: (memory["used"], memory["max"]), high_water=0.85, broker="the broker at x")
    headroom.check()  # 78%: fine
    memory["used"] = 900 * MIB
    headroom = BrokerHeadroom(lambda: (memory["used"], memory["max"]), high_water=0.85, broker="the broker at x")
    with pytest.raises(StoreUnavailableError, match=r"the broker at x uses 900 MiB of its 1,024 MiB maxmemory.*85%"):
        headroom.check()


def test_the_server_is_asked_at_most_once_a_second_and_a_drained_broker_takes_events_again() -> None:
    clock, asked = Clock(), []
    used = [950 * MIB]

    def memory() -> tuple[int, int]:
        asked.append(clock.now)
        return used[0], 1000 * MIB

    headroom = BrokerHeadroom(memory, high_water=0.9, clock=clock)
    for _ in range(50):  # a burst of flushes: one INFO
        with pytest.raises(StoreUnavailableError):
            headroom.check()
    assert asked == [0.0]
    used[0] = 100 * MIB  # the workers drained it
    clock.now = 0.5
    with pytest.raises(StoreUnavailableError):  # not asked again yet
        headroom.check()
    clock.now = 1.0
    headroom.check()
    assert asked == [0.0, 1.0]


@pytest.mark.parametrize("memory", [lambda: (10**12, 0), lambda: (_ for _ in ()).throw(OSError("down"))])
def test_no_limit_or_an_unanswered_question_refuses_nothing(memory: object) -> None:
    BrokerHeadroom(memory, high_water=0.5).check()  # type: ignore[arg-type]


def test_a_high_water_of_one_never_asks() -> None:
    BrokerHeadroom(lambda: (_ for _ in ()).throw(AssertionError("asked")), high_water=1.0).check()
