"""Calling hosted HTTP APIs (embedding providers, chat models): client, retries and errors in one place.

- :mod:`~shardfuse.pipeline.core.http_api.openai_api`: :class:`OpenAIApi`, the one client for
  OpenAI-compatible APIs (embeddings; chat completions for contexts and query expansion).
- :mod:`~shardfuse.pipeline.core.http_api.retries`: :func:`call_with_retries`, the one retry policy
  (tenacity: exponential backoff with full jitter, at least the server's ``Retry-After``, a total budget).
- :mod:`~shardfuse.pipeline.core.http_api.failures`: an HTTP failure as one of our exceptions, with a
  message that names the endpoint, the model and the setting to change; used by every SDK adapter.

Callers are prepare → call → parse adapters: they build the request, call :class:`OpenAIApi` (or their
own SDK) under :func:`call_with_retries`, and read the response.
"""

from shardfuse.pipeline.core.http_api.failures import Endpoint, error_for_status, retry_after_s
from shardfuse.pipeline.core.http_api.openai_api import OpenAIApi
from shardfuse.pipeline.core.http_api.retries import call_with_retries, is_rate_limited, retry_after_of

__all__ = [
    "Endpoint",
    "OpenAIApi",
    "call_with_retries",
    "error_for_status",
    "is_rate_limited",
    "retry_after_of",
    "retry_after_s",
]
