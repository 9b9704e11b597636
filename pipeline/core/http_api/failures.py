"""A hosted API's failure as one of our exceptions: pure functions over a status, a message and headers.

Every provider adapter (the ``openai`` SDK's in :mod:`~shardfuse.pipeline.core.http_api.openai_api`, the
``voyageai`` SDK's in the Voyage embedder) reads what its library caught (status, the server's message, the
headers) and hands it to :func:`error_for_status`, so that one HTTP status means one thing everywhere:

- 429 → :class:`RateLimitedError`, with the wait the server asked for (``retry_after_s``);
- 5xx, 408, 409, no response at all → a transient :class:`EmbeddingProviderError` (retried), with the
  wait a 503 asked for;
- any other 4xx → a permanent :class:`EmbeddingRequestError` (dead-lettered) whose message says which
  endpoint and model refused, what the server said, and which setting to change. Never the API key.

The class names say "embedding" because embeddings came first; chat models (contexts, query expansion)
raise the same classes: what a caller does with them (retry or give up) is the same.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import SecretStr

from shardfuse.pipeline.config.redaction import MASK, redact_url
from shardfuse.pipeline.core.errors import (
    EmbeddingProviderError,
    EmbeddingRequestError,
    RateLimitedError,
    ShardfuseError,
)

# 408 (request timeout) and 409 (lock timeout) are the server's trouble, like 5xx.
_TRANSIENT_4XX = frozenset({408, 409})
# How much of the server's message a failure repeats.
_MAX_DETAIL_CHARS = 300


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where calls go, as messages name it, and the settings section that configures it.

    ``str(endpoint)`` reads ``chat completions (gpt-4o-mini at https://api.openai.com/v1)``: the base URL's
    password, if it has one, masked. ``parameters`` are the settings a rejected request (400, 422) may be
    about, besides the inputs.
    """

    api: str  # what is called: "OpenAI embeddings", "chat completions"
    model: str
    section: str  # the settings section: "embedder", "context", "query.expansion"
    base_url: str = ""
    parameters: tuple[str, ...] = ("model",)

    def __str__(self) -> str:
        where = f" at {redact_url(self.base_url)}" if self.base_url else ""
        return f"{self.api} ({self.model}{where})"

    def setting(self, name: str) -> str:
        """``name`` as a settings key of this endpoint's section, e.g. ``context.model``."""
        return f"{self.section}.{name}"

    @property
    def key_variable(self) -> str:
        """The environment variable that holds this endpoint's API key."""
        return "SHARDFUSE_" + self.section.upper().replace(".", "__") + "__API_KEY"


def error_for_status(
    status: int | None,
    detail: str,
    *,
    endpoint: Endpoint,
    retry_after: float | None = None,
    api_key: SecretStr | None = None,
) -> ShardfuseError:
    """Our exception for an HTTP failure of ``endpoint`` (``status`` None: no response at all).

    ``detail`` is what the server said, with ``api_key`` masked should the server repeat it; ``retry_after``
    the wait a 429 or 503 asked for (see :func:`retry_after_s`).
    """
    key = api_key.get_secret_value() if api_key is not None else ""
    if key:
        detail = detail.replace(key, MASK)
    detail = " ".join(detail.split())[:_MAX_DETAIL_CHARS] or "no detail"
    if status == 429:
        wait = "" if retry_after is None else f"; retry after {retry_after:g}s"
        return RateLimitedError(f"{endpoint} is rate limiting (HTTP 429: {detail}){wait}", retry_after_s=retry_after)
    # Below 400: a success status with a body that is not a response (a proxy's page), worth a retry.
    if status is None or status < 400 or status >= 500 or status in _TRANSIENT_4XX:
        code = "no response" if status is None else f"HTTP {status}"
        # A 503 may name a wait too; the retry policy honours it like a 429's.
        return EmbeddingProviderError(f"{endpoint} failed ({code}: {detail})", retry_after_s=retry_after)
    return EmbeddingRequestError(_refusal(status, detail, endpoint), status=status)


def _refusal(status: int, detail: str, endpoint: Endpoint) -> str:
    """What a person should change after a 4xx that retrying cannot fix."""
    said = f"(HTTP {status}: {detail})"
    checks = " and ".join(endpoint.setting(name) for name in endpoint.parameters)
    hints = {
        400: f"rejected the request {said}; an input may be empty or over the model's limits, or a parameter "
        f"unsupported: check {checks}",
        401: f"rejected the API key {said}; set a valid key in {endpoint.key_variable}",
        403: f"does not allow this API key to use the model {said}; check the key's permissions or "
        f"{endpoint.setting('model')}",
        404: f"has no such model or endpoint {said}; check {endpoint.setting('model')} and "
        f"{endpoint.setting('base_url')}",
        422: f"could not process the request {said}; check {checks} and the inputs",
    }
    return f"{endpoint} {hints.get(status, f'refused the request {said}')}"


def retry_after_s(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """The wait a 429 (or 503) asks for, in seconds: ``retry-after-ms``, else ``Retry-After`` as seconds or
    an HTTP date (relative to ``now``, default the wall clock). None when absent or unreadable; never
    negative."""
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = lowered.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        if math.isfinite(seconds):
            return max(0.0, seconds)
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
