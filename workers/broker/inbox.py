"""Each consumer's inbox: where a message sits between leaving its queue and being recorded as unacked.

kombu's Redis transport receives with BRPOP, which takes the message off its queue, and records it in
``unacked`` only afterwards, in the worker. A worker killed between the two (``kill -9``, the OOM killer)
loses the message for good: it is in no queue and in no ``unacked`` entry. Our transport
(:mod:`shardfuse.workers.broker.transport`) receives with BLMOVE instead, which moves the message into this
consumer's inbox (``shardfuse:inbox:<holder>:<queue>``) in one step on the server. The consumer then records
it in ``unacked`` and takes it out of the inbox in one MULTI. At every instant the message is in its queue,
in an inbox, or in ``unacked``, where the delivery reaper (:mod:`shardfuse.workers.broker.redelivery`) finds it if its
worker dies.

An inbox holds something only for that moment, or after a reply was lost:

- the consumer's connection broke after the move but before the reply was read (a broker restart, the
  transport's own health check): the consumer puts its inbox back on the queue before it receives again;
- the consumer died: its registration in ``shardfuse:inboxes`` stops being refreshed, and once it is older
  than the reaper's grace and the consumer's liveness key is gone, the reaper puts the inbox back.

A message the transport cannot decode is moved to ``shardfuse:unreadable`` for a person to look at, not
dropped and not put back (it would come round forever).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import Any

import redis

from shardfuse.pipeline.coordination.liveness import alive_key, new_holder_id

log = logging.getLogger(__name__)

INBOX_PREFIX = "shardfuse:inbox:"
INBOXES_KEY = "shardfuse:inboxes"  # hash: inbox key -> {"holder", "queue", "seen"} (JSON)
UNREADABLE_KEY = "shardfuse:unreadable"

# Newest first onto the queue's consuming end, so the oldest item comes out first again. kombu publishes
# with LPUSH and receives from the right; BLMOVE ... RIGHT LEFT pushes each received item on the inbox's left.
_PUT_BACK = """
local moved = 0
while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do
  moved = moved + 1
end
if ARGV[1] == '1' then
  redis.call('HDEL', KEYS[3], KEYS[1])
end
return moved
"""

_holder: tuple[int, str] | None = None


def consumer_holder() -> str:
    """This process's consumer id: names its inboxes, its claims and its liveness key (one per process)."""
    global _holder
    if _holder is None or _holder[0] != os.getpid():  # a forked child is a new holder
        _holder = (os.getpid(), new_holder_id("consumer"))
    return _holder[1]


def inbox_key(holder: str, queue: str) -> str:
    return f"{INBOX_PREFIX}{holder}:{queue}"


def register(client: Any, *, inbox: str, holder: str, queue: str, now: float | None = None) -> None:
    """Say (again) that ``holder`` receives from ``queue`` into ``inbox``: a registration not refreshed for
    the reaper's grace, of a holder whose liveness key is gone, belongs to a dead consumer."""
    seen = time.time() if now is None else now
    client.hset(INBOXES_KEY, inbox, json.dumps({"holder": holder, "queue": queue, "seen": seen}))


def put_back(client: Any, *, inbox: str, queue: str, forget: bool = False) -> int:
    """Move everything in ``inbox`` back onto ``queue`` (to be received next), atomically; ``forget`` also
    drops the inbox's registration. Returns how many messages moved."""
    return int(client.eval(_PUT_BACK, 3, inbox, queue, INBOXES_KEY, "1" if forget else "0"))


def quarantine(client: Any, *, inbox: str, item: bytes, reason: str) -> None:
    """Move a message that cannot be decoded out of ``inbox`` into ``shardfuse:unreadable``."""
    pipe = client.pipeline(transaction=True)
    pipe.lrem(inbox, 1, item)
    pipe.lpush(UNREADABLE_KEY, item)
    pipe.execute()
    log.error("a message on %s could not be read and was moved to %s (%s): %r", inbox, UNREADABLE_KEY, reason,
              item[:200])


def inbox_depths(client: redis.Redis) -> dict[str, int]:
    """Messages sitting in some consumer's inbox, per queue (almost always none: see the module text)."""
    registered = client.hgetall(INBOXES_KEY)
    if not registered:
        return {}
    inboxes = list(registered)
    pipe = client.pipeline(transaction=False)
    for inbox in inboxes:
        pipe.llen(inbox)
    depths: dict[str, int] = {}
    for inbox, depth in zip(inboxes, pipe.execute(), strict=True):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            queue = str(json.loads(registered[inbox])["queue"])
            depths[queue] = depths.get(queue, 0) + int(depth)
    return depths


def release_dead_inboxes(client: redis.Redis, *, grace_s: float, now: float | None = None) -> int:
    """Put back the inbox of every consumer that stopped refreshing its registration more than ``grace_s``
    ago and whose liveness key is gone. Returns how many messages moved."""
    now = time.time() if now is None else now
    moved = 0
    for inbox, raw in client.hgetall(INBOXES_KEY).items():
        inbox = inbox.decode() if isinstance(inbox, bytes) else str(inbox)
        try:
            entry = json.loads(raw)
            holder, queue, seen = str(entry["holder"]), str(entry["queue"]), float(entry["seen"])
        except (ValueError, KeyError, TypeError):
            log.error("dropping an unreadable inbox registration %s: %r", inbox, raw)
            client.hdel(INBOXES_KEY, inbox)
            continue
        if now - seen < grace_s or client.exists(alive_key(holder)):
            continue
        count = put_back(client, inbox=inbox, queue=queue, forget=True)
        if count:
            log.warning("put %d message(s) from the inbox of dead consumer %s back on %s", count, holder, queue)
        moved += count
    return moved
