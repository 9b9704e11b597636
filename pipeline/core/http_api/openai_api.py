"""The one client for OpenAI-compatible HTTP APIs: embeddings and chat completions, through the ``openai`` SDK.

:class:`OpenAIApi` builds the SDK client on first use (the SDK takes over a second to import) with the
SDK's own retries off, makes exactly one request per call, and translates every SDK exception into our
tree through :func:`~shardfuse.pipeline.core.http_api.failures.error_for_status`. Retrying is the caller's
job (:func:`~shardfuse.pipeline.core.http_api.retries.call_with_retries`), because the caller holds the
backpressure slot around each attempt and must see every 429 as it happens.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import SecretStr

from shardfuse.pipeline.core.errors import EmbeddingProviderError, ShardfuseError
from shardfuse.pipeline.core.http_api.failures import Endpoint, error_for_status, retry_after_s

if TYPE_CHECKING:
    import openai
    from openai.types import CreateEmbeddingResponse
    from openai.types.chat import ChatCompletion

R = TypeVar("R")

# The SDK refuses to start without a key; local OpenAI-compatible servers ignore it.
UNSET_KEY = "unset"


class OpenAIApi:
    """One endpoint of an OpenAI-compatible API: ``embeddings`` and ``chat_completion``, one request each.

    Thread-safe; :meth:`close` it at shutdown. A ``client`` given to the constructor is used as it is
    (its retry setting included) and never closed here.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        api_key: SecretStr,
        timeout_s: float,
        client: openai.OpenAI | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._client = client
        self._owns_client = client is None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OpenAIApi({str(self.endpoint)!r})"  # never the key

    def warm_up(self) -> None:
        """Build the SDK client now instead of on the first request."""
        self._get_client()

    def embeddings(self, **kwargs: Any) -> CreateEmbeddingResponse:
        """``client.embeddings.create(**kwargs)``, errors translated."""
        from openai.types import CreateEmbeddingResponse

        with self._translated(self._timeout_s):
            response: object = self._get_client().embeddings.create(**kwargs)
        return _checked(response, CreateEmbeddingResponse, self.endpoint)

    def chat_completion(self, *, timeout_s: float | None = None, **kwargs: Any) -> ChatCompletion:
        """``client.chat.completions.create(**kwargs)``, errors translated; ``timeout_s`` overrides the
        client's timeout for this request (a caller with a time budget passes what is left of it)."""
        from openai.types.chat import ChatCompletion

        timeout = self._timeout_s if timeout_s is None else timeout_s
        with self._translated(timeout):
            response: object = self._get_client().chat.completions.create(**kwargs, timeout=timeout)
        return _checked(response, ChatCompletion, self.endpoint)

    def close(self) -> None:
        with self._lock:
            if self._owns_client and self._client is not None:
                self._client.close()
                self._client = None

    @contextmanager
    def _translated(self, timeout_s: float) -> Iterator[None]:
        import openai

        try:
            yield
        except openai.OpenAIError as exc:
            raise translate(exc, self.endpoint, timeout_s=timeout_s, api_key=self._api_key) from exc
        except RecursionError as exc:  # the SDK decodes the body with the json module, which recurses
            raise EmbeddingProviderError(f"{self.endpoint} answered with JSON nested too deeply to read") from exc

    def _get_client(self) -> openai.OpenAI:
        with self._lock:
            if self._client is None:
                self._client = build_client(self.endpoint, api_key=self._api_key, timeout_s=self._timeout_s)
            return self._client


def build_client(endpoint: Endpoint, *, api_key: SecretStr, timeout_s: float) -> openai.OpenAI:
    """An SDK client for ``endpoint`` with its retries off (``max_retries=0``: see the module docstring).

    An empty key is sent as :data:`UNSET_KEY`; an empty base URL means OpenAI's own.
    """
    import openai

    return openai.OpenAI(
        api_key=api_key.get_secret_value() or UNSET_KEY,
        base_url=endpoint.base_url or None,
        timeout=timeout_s,
        max_retries=0,
    )


def translate(exc: Exception, endpoint: Endpoint, *, timeout_s: float, api_key: SecretStr) -> ShardfuseError:
    """Our exception for one failed SDK request to ``endpoint`` (the SDK made exactly one attempt)."""
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return EmbeddingProviderError(f"{endpoint} timed out after {timeout_s:g}s")
    if isinstance(exc, openai.APIConnectionError):
        return EmbeddingProviderError(f"{endpoint} could not be reached: {exc.__cause__ or exc}")
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        detail = str(body.get("message") or exc.message)
        wait = retry_after_s(dict(exc.response.headers.items()))
        return error_for_status(exc.status_code, detail, endpoint=endpoint, retry_after=wait, api_key=api_key)
    # A body that does not parse as a response (a proxy's error page, say), or any other SDK failure.
    return EmbeddingProviderError(f"{endpoint} failed: {type(exc).__name__}: {exc}")


def _checked(response: object, expected: type[R], endpoint: Endpoint) -> R:
    # The SDK hands back the raw text when a proxy answers 200 with something other than JSON.
    if not isinstance(response, expected):
        raise EmbeddingProviderError(
            f"{endpoint} answered with something other than a response ({type(response).__name__})"
        )
    return response
