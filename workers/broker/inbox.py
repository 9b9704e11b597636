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

An item that is not a message a worker can run (:mod:`shardfuse.workers.broker.envelope` says why), or whose
delivery kombu or Celery refuse, is set aside in ``shardfuse:unreadable`` with its reason, its queue and its
exact bytes, for a person to look at: not dropped, and not put back (it would come round forever).
"""

from __future__ import annotations

import base64
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
UNREADABLE_KEY = "shardfuse:unreadable"  # list of JSON records (unreadable_record), newest first
# kombu's unacked bookkeeping (kombu.transport.redis.Channel.unacked_key / unacked_index_key).
UNACKED, UNACKED_INDEX = "unacked", "unacked_index"

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


def unreadable_record(*, reason: str, queue: str, item: bytes, at: float | None = None) -> str:
    """What ``shardfuse:unreadable`` holds for one item set aside: why, from which queue, when, and the item's
    exact bytes (base64), so that a person can read it, fix it and push it back."""
    return json.dumps({"reason": reason, "queue": queue, "at": time.time() if at is None else at,
                       "message": base64.b64encode(item).decode("ascii")})


def set_aside(client: Any, *, queue: str, item: bytes, reason: str, inbox: str | None = None,
              unacked_tag: str | None = None) -> None:
    """Move an item no worker can run into ``shardfuse:unreadable``, in one MULTI with taking it out of
    where it is: ``inbox`` (received by BLMOVE, not yet recorded) or ``unacked`` under ``unacked_tag``
    (recorded, then refused by kombu or Celery). An item received by BRPOP is in neither."""
    pipe = client.pipeline(transaction=True)
    if inbox is not None:
        pipe.lrem(inbox, 1, item)
    if unacked_tag is not None:
        pipe.zrem(UNACKED_INDEX, unacked_tag).hdel(UNACKED, unacked_tag)
    pipe.lpush(UNREADABLE_KEY, unreadable_record(reason=reason, queue=queue, item=item))
    pipe.execute()
    log.error("a message on queue %s cannot be run and was set aside in %s: %s (%d bytes: %r)", queue,
              UNREADABLE_KEY, reason, len(item), item[:120])


def unreadable_count(client: redis.Redis) -> int:
    return int(client.llen(UNREADABLE_KEY))


def recent_unreadable(client: redis.Redis, *, limit: int = 5) -> list[dict[str, Any]]:
    """The newest items set aside, newest first: ``reason``, ``queue``, ``at`` and ``size`` (bytes)."""
    recent = []
    for raw in client.lrange(UNREADABLE_KEY, 0, limit - 1):
        try:
            record = json.loads(raw)
            recent.append({"reason": str(record["reason"]), "queue": str(record["queue"]),
                           "at": float(record["at"]), "size": len(base64.b64decode(record["message"]))})
        except (ValueError, KeyError, TypeError):  # an item set aside before records had a reason
            recent.append({"reason": "(no reason recorded)", "queue": "?", "at": None, "size": len(raw)})
    return recent


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
