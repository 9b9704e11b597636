"""Releasing the messages a dead worker held, without waiting for ``visibility_timeout``.

kombu's Redis transport keeps each delivered, unacknowledged message in the ``unacked`` hash (with its
delivery time in ``unacked_index``) until the worker acknowledges it, and puts it back on its queue only
once it is older than ``visibility_timeout`` (an hour here, since it must outlast the longest task). A
worker killed with ``kill -9`` would so leave its prefetched and running messages stranded for an hour.

Each worker's main process (the one that talks to the broker) therefore publishes, at every heartbeat, the
delivery tags it currently holds (``celery.worker.state.requests``: reserved, running, or waiting for a
countdown) under ``shardfuse:claims:<holder>``, expiring with its liveness. Any worker's heartbeat then
runs :func:`release_orphans` (one at a time, under a Redis lock): an unacked message older than
``grace_s`` that no live worker claims is put back on its queue with kombu's own ``restore_by_tag``. A
worker that was only slow and acknowledges later finds its message already redelivered: the document
lease and the shard's version rule make the second run a no-op (docs/reliability.md).

Redis errors reach callers as ours (:mod:`shardfuse.pipeline.coordination.redis_errors`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

import redis

from shardfuse.pipeline.coordination.liveness import Heartbeat
from shardfuse.pipeline.coordination.redis_errors import redis_errors
from shardfuse.pipeline.core.errors import TransientError
from shardfuse.workers.broker.inbox import consumer_holder, release_dead_inboxes

log = logging.getLogger(__name__)

CLAIMS_PREFIX = "shardfuse:claims:"
CLAIMANTS_KEY = "shardfuse:claimants"
REAPER_LOCK = "shardfuse:reaper"
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
_WHAT = "the delivery reaper"


def held_delivery_tags() -> set[str]:
    """Delivery tags of every message this worker process holds (Celery's own bookkeeping)."""
    from celery.worker import state  # the worker's state module: imported where a worker runs

    tags = set()
    for request in list(state.requests.values()):
        tag = getattr(getattr(request, "message", None), "delivery_tag", None)
        if tag is not None:
            tags.add(str(tag))
    return tags


def publish_claims(client: redis.Redis, *, holder: str, tags: Iterable[str], ttl_s: float) -> None:
    """Replace this holder's claim set (it expires with the holder's liveness)."""
    key = CLAIMS_PREFIX + holder
    tags = list(tags)
    with redis_errors(client, _WHAT):
        pipe = client.pipeline(transaction=True)
        pipe.delete(key)
        if tags:
            pipe.sadd(key, *tags)
            pipe.pexpire(key, int(ttl_s * 1000))
        pipe.sadd(CLAIMANTS_KEY, holder)
        pipe.execute()


def claimed_tags(client: redis.Redis) -> set[str]:
    """Every tag some live worker claims; forgets claimants whose claims have expired."""
    with redis_errors(client, _WHAT):
        holders = [h.decode() if isinstance(h, bytes) else str(h) for h in client.smembers(CLAIMANTS_KEY)]
        if not holders:
            return set()
        pipe = client.pipeline(transaction=False)
        for holder in holders:
            pipe.smembers(CLAIMS_PREFIX + holder)
            pipe.exists(CLAIMS_PREFIX + holder)
        replies = pipe.execute()
        claimed: set[str] = set()
        for holder, members, exists in zip(holders, replies[0::2], replies[1::2], strict=True):
            claimed.update(m.decode() if isinstance(m, bytes) else str(m) for m in members)
            if not exists:
                client.srem(CLAIMANTS_KEY, holder)  # a holder that holds nothing re-adds itself at its next beat
    return claimed


def orphan_grace_s(dead_after_s: float) -> float:
    """How old an unclaimed unacked message must be to count as orphaned: a message delivered moments ago
    may not be in its worker's claims yet (they are published once a beat)."""
    return 2 * dead_after_s


def orphaned_tags(client: redis.Redis, *, grace_s: float, now: float | None = None) -> list[str]:
    """Unacked messages delivered more than ``grace_s`` ago that no live worker claims."""
    cutoff = (time.time() if now is None else now) - grace_s
    with redis_errors(client, _WHAT):
        old = [t.decode() if isinstance(t, bytes) else str(t)
               for t in client.zrangebyscore(UNACKED_INDEX, "-inf", cutoff)]
    if not old:
        return []
    claimed = claimed_tags(client)
    return [tag for tag in old if tag not in claimed]


def release_orphans(client: redis.Redis, restore: Callable[[str], None], *, holder: str, grace_s: float,
                    lock_s: float) -> list[str]:
    """Put every orphaned message back on its queue (``restore(tag)``), and the inboxes of dead consumers
    (:mod:`shardfuse.workers.broker.inbox`); one worker at a time does it."""
    with redis_errors(client, _WHAT):
        if not client.set(REAPER_LOCK, holder, nx=True, px=int(lock_s * 1000)):
            return []
        release_dead_inboxes(client, grace_s=grace_s)
        orphans = orphaned_tags(client, grace_s=grace_s)
        for tag in orphans:
            restore(tag)
    if orphans:
        log.warning("put %d message(s) held by dead worker(s) back on their queues", len(orphans))
    return orphans


class DeliveryWatch:
    """The main worker process's heartbeat: liveness, claims, and the orphan reaper.

    ``restore`` puts a message back by delivery tag (kombu's ``QoS.restore_by_tag`` on a channel of the
    app's broker connection). :meth:`start` never fails for Redis being out of reach: a worker may start
    before its broker answers, and then starts watching at the first interval the broker does.
    """

    def __init__(self, client: redis.Redis, *, interval_s: float, dead_after_s: float,
                 restore: Callable[[str], None], tags: Callable[[], set[str]] = held_delivery_tags) -> None:
        self.holder = consumer_holder()  # the same id names this process's inboxes
        self.pid = os.getpid()
        self.client = client
        self.dead_after_s = dead_after_s
        self._tags = tags
        self._restore = restore
        self.heartbeat = Heartbeat(client, holder=self.holder, interval_s=interval_s, dead_after_s=dead_after_s)
        self.heartbeat.on_beat(self.beat)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._watching = threading.Event()
        self._starter: threading.Thread | None = None

    def beat(self) -> None:
        publish_claims(self.client, holder=self.holder, tags=self._tags(), ttl_s=self.dead_after_s)
        release_orphans(self.client, self._restore, holder=self.holder, grace_s=orphan_grace_s(self.dead_after_s),
                        lock_s=self.heartbeat.interval_s)

    @property
    def watching(self) -> bool:
        """True once the heartbeat runs (Redis answered at least once)."""
        return self._watching.is_set()

    def start(self) -> DeliveryWatch:
        """Beat now and every interval after; if Redis cannot be reached yet, try again every interval in
        the background until it can (or :meth:`stop`)."""
        if not self._try_start():
            self._starter = threading.Thread(target=self._start_when_reachable, name="shardfuse-watch-start",
                                             daemon=True)
            self._starter.start()
        return self

    def _try_start(self) -> bool:
        with self._lock:
            if self._stopped.is_set():
                return True  # nothing left to start
            try:
                self.beat()
                self.heartbeat.start()
                self._watching.set()
            except Exception as exc:  # noqa: BLE001 - whatever stops it now, the watch must be tried again
                log.warning("delivery watch of %s not started yet: %s (trying again in %.0f s)", self.holder, exc,
                            self.heartbeat.interval_s, exc_info=not isinstance(exc, TransientError))
                return False
        log.info("delivery watch of %s started", self.holder)
        return True

    def _start_when_reachable(self) -> None:
        while not self._stopped.wait(self.heartbeat.interval_s):
            if self._try_start():
                return

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
        if self._starter is not None:
            self._starter.join(timeout=self.heartbeat.interval_s + 1)
        self.heartbeat.stop()
        with contextlib.suppress(redis.RedisError):  # otherwise the claims expire on their own
            self.client.delete(CLAIMS_PREFIX + self.holder)
