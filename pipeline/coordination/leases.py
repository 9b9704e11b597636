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

import contextlib
import hashlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from shardfuse.pipeline.coordination.liveness import ALIVE_PREFIX
from shardfuse.pipeline.coordination.redis_errors import redis_errors

log = logging.getLogger(__name__)

_LOCK_STRIPES = 64
_WHAT = "document leases"

LEASE_PREFIX = "shardfuse:lease:"
FENCE_KEY = "shardfuse:fence"

# KEYS: the fence counter, then one lease per document. ARGV: holder, ttl ms, alive-key prefix, then per
# document "reclaim" to take back a lease this holder left behind (else ""). Returns, per document,
# token, "" when taken, or 0, current holder when a live holder has it. One round trip for a message's
# documents: the documents of a message are taken together, and given back together.
_ACQUIRE = """
local out = {}
for i = 2, #KEYS do
    local held = redis.call('HGET', KEYS[i], 'holder')
    if held and redis.call('EXISTS', ARGV[3] .. held) == 1 and not (ARGV[i + 2] == 'reclaim' and held == ARGV[1]) then
        out[#out + 1] = 0
        out[#out + 1] = held
    else
        local token = redis.call('INCR', KEYS[1])
        redis.call('DEL', KEYS[i])
        redis.call('HSET', KEYS[i], 'holder', ARGV[1], 'token', token)
        redis.call('PEXPIRE', KEYS[i], ARGV[2])
        out[#out + 1] = token
        out[#out + 1] = ''
    end
end
return out
"""

# KEYS: leases. ARGV: their tokens. Deletes each lease only if it is still that token's; returns how many.
_RELEASE = """
local released = 0
for i = 1, #KEYS do
    if redis.call('HGET', KEYS[i], 'token') == ARGV[i] then
        released = released + redis.call('DEL', KEYS[i])
    end
end
return released
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


@dataclass(frozen=True, slots=True)
class Busy:
    """A document another live process (or another run in this one) holds the lease of."""

    zone: str
    path: str
    holder: str


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        (taken,) = self.acquire_many([(zone, path)])
        return taken if isinstance(taken, Lease) else None

    def acquire_many(self, documents: Sequence[tuple[str, str]]) -> list[Lease | Busy]:
        """:meth:`acquire` for each of ``documents`` (zone, path), in one round trip: its lease, or who holds
        it (:class:`Busy`). A document named twice is taken once: its second mention is :class:`Busy`, held
        by this process, as a second :meth:`acquire` would find it."""
        if not documents:
            return []
        keys = [lease_key(zone, path) for zone, path in documents]
        # Every stripe the keys fall on, in one order, so two threads taking overlapping batches never
        # wait on each other crosswise.
        locks = [self._locks[i] for i in sorted({self._stripe(key) for key in keys})]
        with contextlib.ExitStack() as held:
            for lock in locks:
                held.enter_context(lock)
            # A lease this process holds under our name but is not working under was left behind: its
            # release failed (Redis was down). Take it back rather than wait lease_s for it to expire.
            seen: set[str] = set()
            reclaim = []
            for key in keys:
                reclaim.append("" if key in self._active or key in seen else "reclaim")
                seen.add(key)
            with redis_errors(self.client, _WHAT):
                reply = self._acquire(keys=[FENCE_KEY, *keys],
                                      args=[self.holder, self.ttl_ms, ALIVE_PREFIX, *reclaim])
            taken: list[Lease | Busy] = []
            for (zone, path), key, token, holder in zip(documents, keys, reply[0::2], reply[1::2], strict=True):
                if int(token) == 0:
                    taken.append(Busy(zone=zone, path=path, holder=_text(holder)))
                else:
                    self._active.add(key)
                    taken.append(Lease(zone=zone, path=path, token=int(token), holder=self.holder))
        return taken

    def _stripe(self, key: str) -> int:
        return hash(key) % _LOCK_STRIPES

    def holder_of(self, zone: str, path: str) -> str | None:
        with redis_errors(self.client, _WHAT):
            held = self.client.hget(lease_key(zone, path), "holder")
        return None if held is None else _text(held)

    def release(self, lease: Lease) -> bool:
        """Give the lease back; False when it had already lapsed (another holder may have it now) or Redis
        could not be reached. Never raises: a caller releasing several leases must reach every one, and a
        lease left behind is taken back by this process's next :meth:`acquire` (or over by another's once
        this one stops beating)."""
        return self.release_many([lease]) == 1

    def release_many(self, leases: Sequence[Lease]) -> int:
        """:meth:`release` for each of ``leases``, in one round trip; how many were still theirs to give
        back (0 when Redis could not be reached). Never raises."""
        if not leases:
            return 0
        keys = [lease_key(lease.zone, lease.path) for lease in leases]
        for key in keys:
            with self._locks[self._stripe(key)]:
                self._active.discard(key)  # even if Redis is unreachable now: acquire then takes it back
        try:
            return int(self._release(keys=keys, args=[lease.token for lease in leases]))
        except redis.RedisError as exc:
            first = leases[0]
            log.warning("could not release the lease(s) of %d document(s) ([%s] %s%s: %s); each is taken back at "
                        "its next acquire", len(leases), first.zone, first.path,
                        "" if len(leases) == 1 else ", ...", exc)
            return 0

    def raise_floor(self, token: int) -> int:
        """Make the next token larger than ``token`` (one a shard reported); returns the counter."""
        with redis_errors(self.client, _WHAT):
            return int(self._raise_floor(keys=[FENCE_KEY], args=[token]))
