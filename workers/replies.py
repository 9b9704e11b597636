"""A search's answer sent straight back to the client that waits for it: one Redis list per request.

Celery's Redis result backend costs a search several round trips on the client (subscribe to the result's
channel, read its key in case the answer came first, read the channel, delete the key, unsubscribe) and a
result-meta encode and store on the worker. A :class:`SearchClient` instead names a fresh list as the
message's ``reply_to`` and sends the message with ``ignore_result``; the worker pushes the answer (or the
error) onto that list, and the client takes it with one ``BLPOP``. A copy of the search sent again replies
onto the same list, so whichever copy answers first wins. Measured in docs/performance.md (session 23).

Written by hand rather than with Celery's ``rpc://`` backend: that backend is app-wide (the pipeline's tasks
and plain ``AsyncResult.get()`` callers keep the Redis result backend), and it would route each reply through
the broker's exchange tables. A caller that sends ``shardfuse.search`` through Celery itself still gets its
answer from the result backend: the worker replies here only to a ``reply_to`` in this module's namespace.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any, Protocol

from redis.exceptions import RedisError

from shardfuse.pipeline.core import errors
from shardfuse.pipeline.core.errors import RemoteSearchError, ShardfuseError, StoreUnavailableError

logger = logging.getLogger(__name__)

# Every reply list's name starts with this: a worker pushes onto no other key, whatever a message names.
PREFIX = "shardfuse:reply:"
# How long an answer nobody took stays (the client gave up, or a second copy answered after the first).
TTL_S = 60
# The longest single BLPOP: below the socket timeout of Celery's backend client (``redis_socket_timeout``,
# 120 s by default), which would otherwise cut a long wait.
_BLPOP_SLICE_S = 60.0


class RedisLists(Protocol):
    """The part of a redis-py client replies use."""

    def pipeline(self, transaction: bool = True) -> Any: ...

    def blpop(self, keys: list[str], timeout: float) -> Any: ...


def new_address() -> str:
    """A fresh reply list's name, for one search (and any copy of it sent again)."""
    return PREFIX + uuid.uuid4().hex


def address_of(reply_to: object) -> str | None:
    """The reply list a message names, or None for one whose caller waits on the result backend."""
    return reply_to if isinstance(reply_to, str) and reply_to.startswith(PREFIX) else None


def success(answer: dict[str, Any]) -> bytes:
    return json.dumps({"answer": answer}, separators=(",", ":")).encode()


def failure(exc: BaseException) -> bytes:
    return json.dumps({"error": {"type": type(exc).__name__, "message": str(exc)}}, separators=(",", ":")).encode()


def send(client: RedisLists, address: str, reply: bytes) -> None:
    """Push ``reply`` onto ``address`` with its expiry, in one round trip."""
    try:
        pipe = client.pipeline(transaction=False)
        pipe.rpush(address, reply)
        pipe.expire(address, TTL_S)
        pipe.execute()
    except RedisError as exc:
        raise StoreUnavailableError(f"cannot send the search's reply to the result backend: {exc}") from exc


def send_failure(client: RedisLists, address: str, exc: BaseException) -> None:
    """Push the search's error onto ``address``; if that fails too, log it and return, so that the task goes
    on to raise the search's own error, not the reply's (the client times out, or sends the search again)."""
    try:
        send(client, address, failure(exc))
    except StoreUnavailableError as unsent:
        logger.warning("the error of the search replying to %s was not sent: %s", address, unsent)


def wait(client: RedisLists, address: str, timeout_s: float) -> dict[str, Any] | None:
    """The answer on ``address`` within ``timeout_s``, None if none came; a failed search raises its error
    (a shardfuse error as its own type, anything else as :class:`RemoteSearchError`)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            # BLPOP's timeout 0 means forever; redis-py sends a float, which Redis 6 accepts.
            popped = client.blpop([address], timeout=max(min(left, _BLPOP_SLICE_S), 0.001))
        except RedisError as exc:
            raise StoreUnavailableError(f"cannot read the search's reply from the result backend: {exc}") from exc
        if popped is not None:
            return _decoded(popped[1])
    return None


def _decoded(raw: bytes) -> dict[str, Any]:
    """The answer a reply holds, or the error it names raised; anything else on the list (it is a plain
    Redis key) is a :class:`RemoteSearchError` saying so, never a ``KeyError``."""
    try:
        reply = json.loads(raw)
        error, answer = (reply.get("error"), reply.get("answer")) if isinstance(reply, dict) else (None, None)
    except (ValueError, RecursionError):  # not JSON, or nested past what the decoder recurses through
        error = answer = None
    if isinstance(error, dict):
        kind, message = str(error.get("type")), str(error.get("message"))
        found = getattr(errors, kind, None)
        if isinstance(found, type) and issubclass(found, ShardfuseError):
            raise found(message)
        raise RemoteSearchError(f"{kind}: {message}")
    if not isinstance(answer, dict):
        raise RemoteSearchError(f"the search's reply is not an answer or an error: {raw[:80]!r}")
    return answer
