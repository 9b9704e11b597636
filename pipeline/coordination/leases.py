"""Per-document leases with fencing tokens (Redis), so two workers never apply one document at once.

At-least-once delivery means a message can run twice: redelivered after ``visibility_timeout``, restored
from a worker that looked dead but was only slow, or retried while a copy still runs. The version rule in
the shard (``seq``) already makes a second application of the same event a no-op; the lease keeps the
second copy from doing the work at all while the first holds the document, and the fencing token keeps a
holder whose lease lapsed from writing over its successor:

- :meth:`DocumentLeases.acquire` takes ``shardfuse:lease:<document>`` if it is free, expired, or held by a
  process that stopped beating (:mod:`shardfuse.pipeline.coordination.liveness`), and returns a token from
  one counter that only grows. A document held by a live process gives None: the caller retries later
  (:class:`~shardfuse.pipeline.core.errors.DocumentBusyError`).
- Every shard write carries its token; the shard keeps the highest it has seen per document and refuses an
  older one (``ApplyOutcome.fenced``). The refused holder raises the counter past the shard's token
  (:meth:`DocumentLeases.raise_floor`: the counter heals itself if Redis ever lost it) and retries under a
  new lease, so a fenced write is delayed, never lost.

Redis errors reach callers as ours (:mod:`shardfuse.pipeline.coordination.redis_errors`):
:class:`~shardfuse.pipeline.core.errors.StoreUnavailableError` when Redis is out of reach.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass

import redis

from shardfuse.pipeline.coordination.liveness import ALIVE_PREFIX
from shardfuse.pipeline.coordination.redis_errors import redis_errors

log = logging.getLogger(__name__)

_LOCK_STRIPES = 64
_WHAT = "document leases"

LEASE_PREFIX = "shardfuse:lease:"
FENCE_KEY = "shardfuse:fence"

# KEYS: lease, fence counter. ARGV: holder, ttl ms, alive-key prefix, "reclaim" to take back a lease this
# holder left behind. Returns {token, ""} when taken, {0, current holder} when a live holder has it.
_ACQUIRE = """
local held = redis.call('HGET', KEYS[1], 'holder')
if held and redis.call('EXISTS', ARGV[3] .. held) == 1 and not (ARGV[4] == 'reclaim' and held == ARGV[1]) then
    return {0, held}
end
local token = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {token, ''}
"""

# KEYS: lease. ARGV: token. Deletes the lease only if it is still this token's.
_RELEASE = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: fence counter. ARGV: a token the counter must reach.
_RAISE_FLOOR = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
    redis.call('SET', KEYS[1], ARGV[1])
    return tonumber(ARGV[1])
end
return current
"""


def lease_key(zone: str, path: str) -> str:
    """The lease key of a document: a digest, since zones and paths may hold any character."""
    # Length-prefixed, so no (zone, path) pair spells another's key whatever characters they hold.
    digest = hashlib.sha256(f"{len(zone)}:{zone}{path}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return LEASE_PREFIX + digest


@dataclass(frozen=True, slots=True)
class Lease:
    zone: str
    path: str
    token: int
    holder: str


class DocumentLeases:
    """Leases of documents held by one process (``holder``, kept alive by its heartbeat)."""

    def __init__(self, client: redis.Redis, *, holder: str, ttl_s: float) -> None:
        self.client = client
        self.holder = holder
        self.ttl_ms = int(ttl_s * 1000)
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)
        self._raise_floor = client.register_script(_RAISE_FLOOR)
        self._active: set[str] = set()  # keys of the leases this process is working under
        # One lock per document key (striped): the reclaim decision and the acquire must not interleave
        # with another thread of this process acquiring the same document, but threads working on other
        # documents must not queue behind each other's Redis round trips.
        self._locks = tuple(threading.Lock() for _ in range(_LOCK_STRIPES))

    def acquire(self, zone: str, path: str) -> Lease | None:
        """The document's lease with a new fencing token, or None while another live process holds it.

        ``ttl_s`` only bounds a lease whose holder keeps beating but never releases it; a dead holder's
        lease is taken over at once.
        """
        key = lease_key(zone, path)
        with self._lock_for(key):
            # A lease this process holds under our name but is not working under was left behind: its
            # release failed (Redis was down). Take it back rather than wait lease_s for it to expire.
            reclaim = "" if key in self._active else "reclaim"
            with redis_errors(self.client, _WHAT):
                token, _held_by = self._acquire(keys=[key, FENCE_KEY],
                                                args=[self.holder, self.ttl_ms, ALIVE_PREFIX, reclaim])
            if int(token) == 0:
                return None
            self._active.add(key)
        return Lease(zone=zone, path=path, token=int(token), holder=self.holder)

    def _lock_for(self, key: str) -> threading.Lock:
        return self._locks[hash(key) % _LOCK_STRIPES]

    def holder_of(self, zone: str, path: str) -> str | None:
        with redis_errors(self.client, _WHAT):
            held = self.client.hget(lease_key(zone, path), "holder")
        return None if held is None else held.decode() if isinstance(held, bytes) else str(held)

    def release(self, lease: Lease) -> bool:
        """Give the lease back; False when it had already lapsed (another holder may have it now) or Redis
        could not be reached. Never raises: a caller releasing several leases must reach every one, and a
        lease left behind is taken back by this process's next :meth:`acquire` (or over by another's once
        this one stops beating)."""
        key = lease_key(lease.zone, lease.path)
        with self._lock_for(key):
            self._active.discard(key)  # even if Redis is unreachable now: acquire then takes it back
        try:
            return bool(self._release(keys=[key], args=[lease.token]))
        except redis.RedisError as exc:
            log.warning("could not release the lease of [%s] %s (%s); it is taken back at its next acquire",
                        lease.zone, lease.path, exc)
            return False

    def raise_floor(self, token: int) -> int:
        """Make the next token larger than ``token`` (one a shard reported); returns the counter."""
        with redis_errors(self.client, _WHAT):
            return int(self._raise_floor(keys=[FENCE_KEY], args=[token]))
