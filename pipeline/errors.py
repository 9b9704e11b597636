"""The shardfuse exception tree.

Every failure that crosses a stage boundary is one of two families, and the Celery layer decides what to
do from the family alone:

- :class:`TransientError`: the same work may succeed later (a connection reset, a 429, a database
  restart). Retried with backoff, then dead-lettered when the retry budget is spent.
- :class:`PermanentError`: retrying cannot help (a malformed event, content missing from the CAS, a
  configuration mismatch). Dead-lettered at once with a reason a person can act on.
"""

from __future__ import annotations


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
