"""The shardfuse exception tree.

Every failure that crosses a stage boundary is one of two families, and the Celery layer decides what to
do from the family alone:

- :class:`TransientError`: the same work may succeed later (a connection reset, a 429, a database
  restart). Retried with backoff, then dead-lettered when the retry budget is spent.
- :class:`PermanentError`: retrying cannot help (a malformed event, content missing from the CAS, a
  configuration mismatch). Dead-lettered at once with a reason a person can act on.
"""

from __future__ import annotations

from typing import Any


class ShardfuseError(Exception):
    """Base of every error raised by shardfuse code."""


class TransientError(ShardfuseError):
    """The operation may succeed if retried later."""


class PermanentError(ShardfuseError):
    """Retrying cannot help; the work goes to the dead-letter store with this message as its reason."""


class InvalidEventError(PermanentError):
    """A write event failed validation at the edge."""


class ContentNotFoundError(PermanentError):
    """The CAS holds no content for the hash an event names."""


class ConfigurationError(PermanentError):
    """Settings are inconsistent with each other or with what is already stored."""


class StoreUnavailableError(TransientError):
    """A shard database, the broker or the CAS could not be reached."""


class EmbeddingProviderError(TransientError):
    """The embedding provider failed in a way worth retrying."""


class InvalidQueryError(PermanentError):
    """A search request is malformed (empty query, bad k, unknown mode)."""


class RateLimitedError(EmbeddingProviderError):
    """The embedding provider answered 429: slow down, and wait at least ``retry_after_s`` when it is known.

    ``retry_after_s`` comes from the response's ``Retry-After`` (seconds or an HTTP date) or
    ``retry-after-ms`` header; None when the provider named no wait.
    """

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[Any, ...]:
        # The prefork pool copies exceptions between processes through __reduce__; the default one would drop
        # the keyword argument.
        return _rebuild_rate_limited, (str(self), self.retry_after_s)


class EmbeddingRequestError(PermanentError):
    """The embedding provider rejected the request itself (bad key, unknown model, invalid input).

    ``status`` is the HTTP status when there was one; the message says what a person should change.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_request_error, (str(self), self.status)


def _rebuild_rate_limited(message: str, retry_after_s: float | None) -> RateLimitedError:
    return RateLimitedError(message, retry_after_s=retry_after_s)


def _rebuild_request_error(message: str, status: int | None) -> EmbeddingRequestError:
    return EmbeddingRequestError(message, status=status)
