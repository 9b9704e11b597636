"""A token bucket per caller in Redis, shared by every process that asks: the HTTP API's per-key rate limit.

Cluster-wide rather than per process, because API replicas are scaled freely (compose ``--scale``, a k8s
Deployment): a bucket in each process's memory would let a key make N times its rate through N replicas, and
the rate would change with every scale-out. One Lua script checks and takes a token atomically, so two
replicas can never both take the last one; the time is the Redis server's (``TIME``), so replicas on hosts with
skewed clocks agree. A bucket idle long enough to be full again expires from Redis by itself.

Redis layout: ``shardfuse:ratelimit:{name}:{caller}``, a hash of ``tokens`` and ``at`` (seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from redis import Redis

from shardfuse.pipeline.coordination.redis_errors import redis_errors

KEY_PREFIX = "shardfuse:ratelimit"

# KEYS[1] the bucket; ARGV: rate (tokens/s), burst (capacity), cost, now (-1: the server's clock).
# Returns {1, tokens left} when taken, {0, seconds until `cost` tokens are there} when refused (as strings:
# Lua numbers become integers on the way out).
_TAKE = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(state[1]), tonumber(state[2])
if tokens == nil or at == nil then
  tokens, at = burst, now
end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local ttl = math.ceil(burst / rate) + 1
if tokens >= cost then
  tokens = tokens - cost
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
  redis.call('EXPIRE', KEYS[1], ttl)
  return {1, tostring(tokens)}
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], ttl)
return {0, tostring((cost - tokens) / rate)}
"""


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a request may go ahead; if not, how long until it may (``retry_after_s``)."""

    allowed: bool
    retry_after_s: float = 0.0

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` in whole seconds (rounded up, at least 1: a client waiting 0 s would only be refused
        again)."""
        return str(max(1, math.ceil(self.retry_after_s)))


class TokenBucket:
    """Buckets of ``burst`` tokens refilled at ``rate_per_s``, one per caller, under ``name``."""

    def __init__(self, client: Redis, *, name: str, rate_per_s: float, burst: int) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate_per_s > 0 and burst >= 1, got {rate_per_s} and {burst}")
        self._client = client
        self._name = name
        self._rate = rate_per_s
        self._burst = burst
        self._take = client.register_script(_TAKE)

    def take(self, caller: str, *, cost: int = 1, now: float | None = None) -> Decision:
        """Take ``cost`` tokens from ``caller``'s bucket if it holds them. ``now``: for tests (else Redis's
        clock). Redis out of reach is a :class:`~shardfuse.pipeline.core.errors.StoreUnavailableError`."""
        key = f"{KEY_PREFIX}:{self._name}:{caller}"
        with redis_errors(self._client, "rate limit"):
            taken, value = self._take(keys=[key], args=[self._rate, self._burst, cost, -1 if now is None else now])
        amount = float(value)
        return Decision(True) if int(taken) == 1 else Decision(False, retry_after_s=amount)
