"""Publishers stop short of the broker's memory limit, so the workers can still drain it.

The broker's Redis runs with ``maxmemory`` and ``noeviction`` (docs/operations.md, "Memory budget"): full, it
refuses every command that may grow memory, which includes a consumer's receive (BLMOVE into its inbox)
and its record in ``unacked``. If publishers filled it to the limit, the workers could no longer take the
messages that would empty it: the pipeline would stall until a person raised the limit. So a publisher
refuses new events, with :class:`StoreUnavailableError` (its sink keeps them, as for any broker outage),
once ``used_memory`` passes ``broker.publish_high_water`` of ``maxmemory``: the rest is the workers'
headroom. Asked of the server at most once a second (``INFO memory`` is cheap, but not per message).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shardfuse.pipeline.core.errors import StoreUnavailableError

CHECK_EVERY_S = 1.0


class BrokerHeadroom:
    """``check()`` raises :class:`StoreUnavailableError` while the broker is above its high-water mark.

    ``memory`` returns the server's ``(used_memory, maxmemory)``; a ``maxmemory`` of 0 (no limit) or a
    ``high_water`` of 1 or more never refuses. A failure to ask is not a refusal: the send that follows
    reports an unreachable broker itself."""

    def __init__(self, memory: Callable[[], tuple[int, int]], *, high_water: float, broker: str = "the broker",
                 every_s: float = CHECK_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._memory = memory
        self._high_water = high_water
        self._broker = broker
        self._every_s = every_s
        self._clock = clock
        self._checked_at = -float("inf")
        self._full: str | None = None

    def check(self) -> None:
        if self._high_water >= 1:
            return
        now = self._clock()
        if now - self._checked_at >= self._every_s:
            self._checked_at = now
            self._full = self._measure()
        if self._full is not None:
            raise StoreUnavailableError(self._full)

    def _measure(self) -> str | None:
        try:
            used, limit = self._memory()
        except Exception:  # noqa: BLE001 - not knowing is no reason to refuse; the send reports a dead broker
            return None
        if limit <= 0 or used < self._high_water * limit:
            return None
        return (f"{self._broker} uses {used / 2**20:,.0f} MiB of its {limit / 2**20:,.0f} MiB maxmemory, past "
                f"broker.publish_high_water ({self._high_water:.0%}): new events wait until the workers drain the "
                "queues (the rest is their headroom); raise maxmemory or add workers if this lasts")


class RedisMemory:
    """``(used_memory, maxmemory)`` of the Redis server ``connect()`` reaches, connecting on first use (a URL
    redis-py cannot open, such as ``sentinel://``, then fails each check, which refuses nothing)."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._client: Any = None

    def __call__(self) -> tuple[int, int]:
        if self._client is None:
            self._client = self._connect()
        info = self._client.info("memory")
        return int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
