"""The Redis-backed global limit on one provider and model's requests, shared by every embed worker.

At most ``global_max_concurrent`` requests in flight, at most ``requests_per_minute`` requests and
``tokens_per_minute`` tokens in any 60 s, and a shared pause gate that a provider's ``Retry-After`` sets
for everyone. Each check-and-take is one Lua script, so two processes can never both take the last slot.

Redis layout, under ``shardfuse:embedlimit:{provider}:{model}:``:

- ``leases``: sorted set of lease ids scored by their expiry time. A worker that crashes mid-request never
  releases its lease; it stops counting once its expiry passes (``request_timeout_s`` + a margin), so a
  crash costs one slot for at most that long and never leaks it.
- ``window`` and ``window_tokens``: the requests admitted in the last 60 s (sorted set of
  ``{lease id}:{tokens}`` scored by admission time) and the running sum of their tokens. Exact sliding
  window: expired entries are trimmed (and their tokens subtracted) by the next caller, so each admission
  costs O(1) amortised, and a refusal knows exactly when the budget frees up.
- ``paused_until``: the time before which nobody may send (a provider's ``Retry-After``).

Times in Redis are the Redis server's clock (``TIME`` inside the scripts) unless a clock is injected, so
workers on hosts with skewed clocks still agree on lease expiry and windows.
"""

from __future__ import annotations

import enum
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from shardfuse.pipeline.coordination.redis_errors import redis_errors
from shardfuse.pipeline.core.errors import BackpressureTimeout

log = logging.getLogger(__name__)

KEY_PREFIX = "shardfuse:embedlimit"
# A lease outlives its request by this much: the request itself is bounded by ``request_timeout_s``, the
# margin covers connection set-up, response parsing and a slow release round trip.
LEASE_MARGIN_S = 10.0
# A provider's Retry-After beyond this is not applied to every worker (one odd header must not stall the
# whole fleet for an hour); the failing call's own retry still honours it, or gives up.
MAX_PAUSE_S = 300.0
WINDOW_S = 60


# Every script takes ARGV[1] = now in seconds, or -1 for the Redis server's clock.
_NOW = """
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

# KEYS: leases, paused_until, window, window_tokens.
# ARGV: now, lease id, lease ttl s, max concurrent, requests per minute, tokens per minute, tokens.
# Returns {code, seconds to wait as a string}: 0 taken, 1 paused, 2 concurrency, 3 requests, 4 tokens.
_ACQUIRE = (
    _NOW
    + """
local paused_until = tonumber(redis.call('GET', KEYS[2]) or '0')
if paused_until > now then
  return {1, tostring(paused_until - now)}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return {2, '0'}
end
local rpm, tpm, need = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local window = tonumber(ARGV[8])
if rpm > 0 or tpm > 0 then
  local horizon = now - window
  local used = tonumber(redis.call('GET', KEYS[4]) or '0')
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', horizon)) do
    used = used - tonumber(string.match(old, ':(%d+)$'))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', horizon)
  local count = redis.call('ZCARD', KEYS[3])
  -- The sum heals itself whenever the window empties, should it ever drift from the entries.
  if count == 0 or used < 0 then used = 0 end
  -- One request larger than the whole budget goes through alone rather than waiting forever.
  if tpm > 0 and need > tpm then need = tpm end
  local code, wait = 0, 0
  if rpm > 0 and count + 1 > rpm then
    local oldest = redis.call('ZRANGE', KEYS[3], count - rpm, count - rpm, 'WITHSCORES')
    code, wait = 3, tonumber(oldest[2]) + window - now
  end
  if tpm > 0 and used + need > tpm then
    -- The wait is until enough of the oldest entries age out (a whole window if the sum has drifted).
    local entries = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
    local freed, w = 0, window
    for i = 1, #entries, 2 do
      freed = freed + tonumber(string.match(entries[i], ':(%d+)$'))
      if used - freed + need <= tpm then
        w = tonumber(entries[i + 1]) + window - now
        break
      end
    end
    if code == 0 or w > wait then code, wait = 4, w end
  end
  if code ~= 0 then
    redis.call('SET', KEYS[4], used, 'EX', 2 * window)
    return {code, tostring(wait)}
  end
  redis.call('ZADD', KEYS[3], now, ARGV[2] .. ':' .. need)
  redis.call('EXPIRE', KEYS[3], 2 * window)
  redis.call('SET', KEYS[4], used + need, 'EX', 2 * window)
end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 60)
return {0, '0'}
"""
)

# KEYS: paused_until. ARGV: now, delay s. Only ever moves the gate later. Returns 1 when it moved.
_PAUSE = (
    _NOW
    + """
local delay = tonumber(ARGV[2])
local until_ts = now + delay
if until_ts > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], tostring(until_ts), 'EX', math.ceil(delay) + 60)
  return 1
end
return 0
"""
)

# KEYS: leases. ARGV: now. Leases not yet expired.
_IN_FLIGHT = (
    _NOW
    + """
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
"""
)


class _Refusal(enum.IntEnum):
    """Why a lease was not granted (the acquire script's return code)."""

    PAUSED = 1
    CONCURRENCY = 2
    REQUESTS = 3
    TOKENS = 4

    @property
    def description(self) -> str:
        return _REFUSAL_TEXT[self]


_REFUSAL_TEXT = {
    _Refusal.PAUSED: "the provider's Retry-After pause",
    _Refusal.CONCURRENCY: "a free global concurrency slot",
    _Refusal.REQUESTS: "the requests-per-minute budget",
    _Refusal.TOKENS: "the tokens-per-minute budget",
}


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted request slot; ``waited_s`` is how long it took to get it."""

    lease_id: str
    waited_s: float


class GlobalLimiter:
    """Concurrency, request and token budgets for one provider and model, shared through Redis.

    ``clock`` (seconds) defaults to the Redis server's clock inside the scripts and ``time.monotonic``
    for local deadlines; tests inject one clock for both, with a ``sleep`` that advances it. Safe to
    share between threads (redis-py clients are). Redis errors become ours
    (:mod:`shardfuse.pipeline.coordination.redis_errors`).
    """

    def __init__(
        self,
        client: Redis,
        *,
        provider: str,
        model: str,
        max_concurrent: int,
        lease_ttl_s: float,
        requests_per_minute: int = 0,
        tokens_per_minute: int = 0,
        poll_s: float = 0.05,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        key_prefix: str = KEY_PREFIX,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, not {max_concurrent}")
        base = f"{key_prefix}:{provider}:{model}"
        self._keys = {name: f"{base}:{name}" for name in ("leases", "paused_until", "window", "window_tokens")}
        self._client = client
        self._max_concurrent = max_concurrent
        self._lease_ttl_s = lease_ttl_s
        self._rpm = requests_per_minute
        self._tpm = tokens_per_minute
        self._poll_s = poll_s
        self._clock = clock
        self._local_clock = clock or time.monotonic
        self._sleep = sleep
        self._acquire_script = client.register_script(_ACQUIRE)
        self._pause_script = client.register_script(_PAUSE)
        self._in_flight_script = client.register_script(_IN_FLIGHT)

    @contextmanager
    def lease(self, tokens: int, *, timeout_s: float) -> Iterator[Lease]:
        """Hold one request slot (and ``tokens`` of the minute's budget) for the ``with`` block.

        Waits up to ``timeout_s`` (0: one try); raises :class:`BackpressureTimeout` if nothing frees up in
        time, at once when the wait is known to be longer (a pause or a budget that frees up too late).
        """
        lease = self._acquire(max(0, int(tokens)), timeout_s=timeout_s)
        try:
            yield lease
        finally:
            self._release(lease.lease_id)

    def pause_for(self, delay_s: float) -> None:
        """Stop every worker from sending for ``delay_s`` (counted on the limiter's clock). Never shortens
        a pause already set; capped at ``MAX_PAUSE_S``."""
        delay_s = min(delay_s, MAX_PAUSE_S)
        if delay_s <= 0:
            return
        self._run(self._pause_script, ["paused_until"], [delay_s])

    def pause_until(self, ts: float) -> None:
        """Stop every worker from sending until ``ts``: wall-clock epoch seconds, or the injected clock's
        time. Prefer :meth:`pause_for`, which does not depend on this host's clock agreeing with Redis's."""
        now = self._clock() if self._clock is not None else time.time()
        self.pause_for(ts - now)

    def in_flight(self) -> int:
        """Leases held right now (expired ones excluded)."""
        return int(self._run(self._in_flight_script, ["leases"], []))

    def _acquire(self, tokens: int, *, timeout_s: float) -> Lease:
        lease_id = uuid.uuid4().hex
        started = self._local_clock()
        deadline = started + timeout_s
        while True:
            code, wait_s = self._run(
                self._acquire_script,
                ["leases", "paused_until", "window", "window_tokens"],
                [lease_id, self._lease_ttl_s, self._max_concurrent, self._rpm, self._tpm, tokens, WINDOW_S],
            )
            now = self._local_clock()
            if int(code) == 0:
                return Lease(lease_id, now - started)
            refusal, wait = _Refusal(int(code)), float(wait_s)
            remaining = deadline - now
            if wait > remaining or remaining <= 0:
                raise BackpressureTimeout(
                    f"no embedding request slot within {timeout_s:g}s: waiting for {refusal.description}"
                    + (f" ({wait:.1f}s more)" if wait > 0 else "")
                )
            # Sleep until the known wait is over (pause, window) or poll (concurrency), jittered so the
            # workers woken by the same event do not all retry in the same instant.
            self._sleep(min(remaining, wait + self._poll_s * random.uniform(0.5, 1.5)))

    def _release(self, lease_id: str) -> None:
        try:
            released = self._client.zrem(self._keys["leases"], lease_id)
        except RedisError as exc:
            # The lease expires on its own; failing here would throw away a request that succeeded.
            log.warning("could not release embedding lease %s (it expires by itself): %s", lease_id, exc)
            return
        if not released:
            log.warning("embedding lease %s had expired before the request finished; raise the lease ttl "
                        "above the request time", lease_id)

    def _run(self, script: Any, keys: list[str], args: list[object]) -> Any:
        now = self._clock() if self._clock is not None else -1
        with redis_errors(self._client, "the embedding rate limiter"):
            return script(keys=[self._keys[name] for name in keys], args=[now, *args])
