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


class UnprocessableContentError(PermanentError):
    """Content that decoded as text but that a stage cannot process (the tokenizer crashed on it): the same
    content fails the same way every time."""


class DeadlineExceededError(PermanentError):
    """One document's work (CAS read, decode, chunking, LLM context) ran past its per-document deadline
    (``ingest.document_deadline_s``). The same content would overrun again: it is dead-lettered with its
    reason while the other documents of its message complete."""


class DocumentStuckError(TransientError):
    """One document's work was blocked past its deadline in a call no deadline check reaches: a CAS read on a
    hung filesystem, a wait for a database that is down. That is the infrastructure, not the content: the
    document is retried with backoff (the retry budget dead-letters it if the block lasts)."""


class UnreadableMessageError(PermanentError):
    """Bytes on a queue that are not a message shardfuse's workers can run (not a complete kombu envelope,
    not JSON, too deep, too large, an unknown task): set aside in ``shardfuse:unreadable`` with this reason."""


class ConfigurationError(PermanentError):
    """Settings are inconsistent with each other or with what is already stored."""


class StoreUnavailableError(TransientError):
    """A shard database, Redis (the broker, leases, limits), or the CAS could not be reached. The message
    names which and where (``host:port``, never a password)."""


class SchemaMissingError(TransientError):
    """A table the work needs does not exist yet: every worker creates its shards' and the shared tables as
    it starts, so the work is retried; read-only views (``shardfuse status``, the exporter) show it as empty."""


class BackpressureTimeout(TransientError):
    """No embedding request slot or per-minute budget became free in time (the embed limiters): the work may
    succeed later."""


class DocumentBusyError(TransientError):
    """Another live worker holds the document's lease (say a redelivered copy of a message still running):
    try again once it is done. Not counted against the retry budget."""


class LeaseLostError(TransientError):
    """The shard refused a write whose fencing token is older than one it has seen (``stored_fence``): this
    worker's lease lapsed and another took the document over. The work is retried under a new lease."""

    def __init__(self, message: str, *, stored_fence: int = 0) -> None:
        super().__init__(message)
        self.stored_fence = stored_fence

    @classmethod
    def fenced(cls, *, stored_fence: int, carried: int | None) -> LeaseLostError:
        return cls(f"the shard has seen lease token {stored_fence} for this document and this write carried "
                   f"{carried}: the lease lapsed and another worker took the document over",
                   stored_fence=stored_fence)

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_lease_lost, (str(self), self.stored_fence)


class EmbeddingModelsChangedError(TransientError):
    """A zone's writes started to fill another embedding model's column (a reindex began) after this
    document was embedded: it is embedded again, with every model the zone now needs."""


class EmbeddingProviderError(TransientError):
    """The embedding provider (or a chat model) failed in a way worth retrying. ``retry_after_s`` is the wait
    the server asked for (a 503's ``Retry-After``), None when it named none."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_provider_error, (str(self), self.retry_after_s)


class InvalidQueryError(PermanentError):
    """A search request is malformed (empty query, bad k, unknown mode)."""


class RemoteSearchError(ShardfuseError):
    """A query worker failed the search with an error outside this tree (a defect, not the request: its type
    and message are in the text). Raised on the client (:class:`shardfuse.SearchClient`), also when what came
    back on the reply list is no answer at all."""


class RateLimitedError(EmbeddingProviderError):
    """The embedding provider answered 429: slow down, and wait at least ``retry_after_s`` when it is known.

    ``retry_after_s`` comes from the response's ``Retry-After`` (seconds or an HTTP date) or
    ``retry-after-ms`` header; None when the provider named no wait.
    """

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message, retry_after_s=retry_after_s)

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


def _rebuild_provider_error(message: str, retry_after_s: float | None) -> EmbeddingProviderError:
    return EmbeddingProviderError(message, retry_after_s=retry_after_s)


def _rebuild_rate_limited(message: str, retry_after_s: float | None) -> RateLimitedError:
    return RateLimitedError(message, retry_after_s=retry_after_s)


def _rebuild_request_error(message: str, status: int | None) -> EmbeddingRequestError:
    return EmbeddingRequestError(message, status=status)


def _rebuild_lease_lost(message: str, stored_fence: int) -> LeaseLostError:
    return LeaseLostError(message, stored_fence=stored_fence)
