"""Redis errors translated into ours, where they arise: every Redis adapter runs its calls inside
:func:`redis_errors`, so nothing above it sees a ``redis.RedisError``.

- Redis out of reach (connection refused or reset, a timeout, a server still loading its data after a
  restart, a refused password) is :class:`~shardfuse.pipeline.core.errors.StoreUnavailableError`.
- Any other failure of a Redis call (out of memory, a read-only replica, a script error) is a plain
  :class:`~shardfuse.pipeline.core.errors.TransientError`: the work is retried, then dead-lettered with the
  server's own words when the retry budget is spent.

The message names what was being done and where Redis is (``host:port/db`` or the socket path, never the
password), and the Redis error is chained as the cause.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from shardfuse.pipeline.core.errors import StoreUnavailableError, TransientError

# What "out of reach" means (BusyLoadingError and AuthenticationError are ConnectionErrors).
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)


def redis_location(client: Any) -> str:
    """Where ``client`` connects, fit for a message: ``host:port/db`` or ``unix:path/db``; no credentials."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None) or {}
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}/{db}"
    if kwargs.get("host"):
        return f"{kwargs['host']}:{kwargs.get('port', 6379)}/{db}"
    return "an unknown address"


@contextmanager
def redis_errors(client: Any, what: str) -> Iterator[None]:
    """Run the block's Redis calls on ``client`` with their errors translated; ``what`` says what they were
    for (``"document leases"``), as the message's first words."""
    try:
        yield
    except UNREACHABLE as exc:
        raise StoreUnavailableError(
            f"{what}: Redis at {redis_location(client)} is unreachable ({type(exc).__name__}: {exc})"
        ) from exc
    except redis.RedisError as exc:
        raise TransientError(f"{what}: Redis at {redis_location(client)} failed ({type(exc).__name__}: {exc})") from exc
