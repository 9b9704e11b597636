"""Hard time limit strikes: how often the items of a message were in a run its task's hard time limit killed.

With ``task_acks_on_timeout=False`` (:func:`shardfuse.workers.app.create_app`) a message whose run is
killed by the hard limit goes back on its queue instead of being acknowledged and lost. A message that
overruns every time would then come back forever, so each kill is counted: Celery reports it in the worker's
main process, through the task's ``on_failure`` with :class:`~celery.exceptions.TimeLimitExceeded`
(:meth:`shardfuse.workers.tasks.base.PipelineTask.on_failure`), which records a strike for every item of the
killed message (each event, each document; :func:`message_items_of`). Counting per item, not per message,
keeps the count when the items travel on in another message: a retry of some of them, or the message that
waits for their documents' leases, which the killed process still held. An item that comes back with
:data:`MAX_STRIKES` strikes is dead-lettered with :class:`HardTimeLimitError` instead of being run again;
the items with fewer run.

The counters live in the broker's Redis for :data:`STRIKES_TTL_S`. If Redis loses them, an item runs up to
:data:`MAX_STRIKES` more times: never lost.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from shardfuse.pipeline.coordination.redis_errors import redis_errors
from shardfuse.pipeline.core.errors import PermanentError

PREFIX = "shardfuse:hard_limit_strikes:"
# In this many runs the hard limit killed: the next delivery dead-letters the item.
MAX_STRIKES = 3
STRIKES_TTL_S = 7 * 24 * 3600
_WHAT = "hard time limit strikes"


class HardTimeLimitError(PermanentError):
    """An item was in :data:`MAX_STRIKES` runs that its task's hard time limit killed."""

    @classmethod
    def struck_out(cls, *, strikes: int, hard_limit_s: float | None) -> HardTimeLimitError:
        limit = "its hard time limit" if hard_limit_s is None else f"the hard time limit ({hard_limit_s:g}s)"
        return cls(f"exceeded {limit} {strikes} times: each run holding it was killed before it could finish, so "
                   "it is not run again. Look for a document that blocks without a deadline (the worker log names "
                   "the events of each run), fix or remove it, then retry this dead letter")


def item_key(item: Any) -> str:
    """The Redis key of ``item``'s strikes: a digest of its JSON (the same item in any message). A document of
    the embed stage is known by its event and ``refresh``, which determine it: digesting its chunks' text too
    cost 2.4 % of an embed worker's CPU at every delivery (session 26), and a document is never its event."""
    if isinstance(item, dict) and isinstance(item.get("event"), dict) and "chunks" in item:
        item = {"document of": item["event"], "refresh": item.get("refresh")}
    encoded = json.dumps(item, sort_keys=True, separators=(",", ":"), default=str).encode()
    return PREFIX + hashlib.sha256(encoded).hexdigest()


def message_items_of(kwargs: Mapping[str, Any] | None) -> list[Any]:
    """The items of a pipeline message's arguments: each element of its list arguments (``events``,
    ``documents``) and each single item (``event``, ``document``); a message without either (``shard=``) is
    its own item."""
    kwargs = kwargs or {}
    items = [element for value in kwargs.values() if isinstance(value, list) for element in value]
    items += [value for value in kwargs.values() if isinstance(value, dict)]
    return items or [dict(kwargs)]


class HardLimitStrikes:
    """The strike counters, in the broker's Redis."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def record(self, items: Sequence[Any]) -> int:
        """One more strike for each of ``items``; the most any of them has now."""
        with redis_errors(self._client, _WHAT):
            pipe = self._client.pipeline(transaction=False)
            for item in items:
                pipe.incr(item_key(item))
                pipe.expire(item_key(item), STRIKES_TTL_S)
            replies = pipe.execute()
        return max((int(n) for n in replies[::2]), default=0)

    def counts(self, items: Sequence[Any]) -> list[int]:
        """The strikes of each of ``items`` (0 for none)."""
        if not items:
            return []
        with redis_errors(self._client, _WHAT):
            values = self._client.mget([item_key(item) for item in items])
        return [int(value or 0) for value in values]
