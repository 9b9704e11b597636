"""Voyage AI's rerank API through the ``voyageai`` SDK's ``Client.rerank`` (imported when the reranker is built).

A ``voyageai.Client`` holds its timeout, and the budget gives every call its own: each call builds a client
(a few attribute assignments; the SDK keeps its HTTP session per thread) with ``max_retries=0`` (exactly one
attempt: retrying is the stage's job) and what is left of the budget as its timeout. ``truncation`` is on: a
candidate over the model's context is cut by the server rather than failing the whole rerank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import SecretStr

from shardfuse.pipeline.core.errors import ConfigurationError, EmbeddingProviderError, ShardfuseError
from shardfuse.pipeline.core.http_api import Endpoint, error_for_status, retry_after_s
from shardfuse.query.rerank.port import MalformedRerankError, RerankTimeoutError, scores_by_index


class VoyageReranker:
    """Scores with a Voyage rerank model (``rerank-2.5``, ``rerank-2.5-lite``, …). Thread-safe."""

    def __init__(self, model: str, *, api_key: SecretStr, base_url: str = "") -> None:
        try:
            import voyageai.util
        except ImportError as exc:
            raise ConfigurationError("rerank.provider = voyage needs the voyageai SDK: pip install voyageai") from exc
        key = api_key.get_secret_value()
        if not key:
            raise ConfigurationError("rerank.provider = voyage needs an API key: set SHARDFUSE_RERANK__API_KEY")
        self._model = model
        self._api_key = api_key
        self._base_url = (base_url or voyageai.util.get_default_base_url(key)).rstrip("/")
        self._endpoint = Endpoint("Voyage rerank", model, "rerank", self._base_url)

    def __repr__(self) -> str:
        return f"VoyageReranker({str(self._endpoint)!r})"  # never the key

    @property
    def name(self) -> str:
        return f"voyage:{self._model}"

    def rerank(self, query: str, texts: Sequence[str], *, timeout_s: float) -> list[float]:
        from voyageai.client import Client
        from voyageai.error import VoyageError

        client = Client(api_key=self._api_key.get_secret_value(), max_retries=0, timeout=timeout_s,
                                 base_url=self._base_url)
        try:
            result = client.rerank(query, list(texts), self._model, truncation=True)
        except VoyageError as exc:
            raise _translate(exc, self._endpoint, self._api_key, timeout_s=timeout_s) from exc
        # An answer of another shape, or JSON nested past what the SDK's json decoder recurses through.
        except (AttributeError, KeyError, TypeError, IndexError, ValueError, RecursionError) as exc:
            raise MalformedRerankError(
                f"{self._endpoint} answered without scores ({type(exc).__name__}: {exc})") from exc
        pairs: list[tuple[object, object]] = [(item.index, item.relevance_score) for item in result.results]
        return scores_by_index(pairs, len(texts), source=str(self._endpoint))

    def close(self) -> None:
        return  # nothing held between calls


def _translate(exc: Exception, endpoint: Endpoint, api_key: SecretStr, *, timeout_s: float) -> ShardfuseError:
    """Our exception for a voyageai exception (the SDK made exactly one attempt)."""
    from voyageai import error

    if isinstance(exc, error.Timeout):
        return RerankTimeoutError(f"{endpoint} timed out after {timeout_s:.3g}s")
    if isinstance(exc, error.APIConnectionError):
        return EmbeddingProviderError(f"{endpoint} could not be reached: {exc}")
    status: Any = getattr(exc, "http_status", None)
    headers = getattr(exc, "headers", None)
    detail = str(getattr(exc, "user_message", None) or exc)
    if isinstance(status, int) and 200 <= status < 300:  # the SDK could not read a success's body
        return MalformedRerankError(f"{endpoint} answered with something other than a rerank result: {detail[:120]}")
    wait = retry_after_s(dict(headers.items())) if headers else None
    return error_for_status(status if isinstance(status, int) else None, detail, endpoint=endpoint, retry_after=wait,
                            api_key=api_key)
