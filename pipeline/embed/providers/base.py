"""The embedding port: what every embedding provider adapter looks like."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.core.errors import (
    ConfigurationError,
    EmbeddingProviderError,
    EmbeddingRequestError,
    RateLimitedError,
    ShardfuseError,
)

Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Turns text into L2-normalised float32 vectors of a fixed size.

    ``name`` identifies the vector space (provider and model, e.g. ``"local:all-MiniLM-L6-v2"``): the
    embedding cache is keyed by it, so two embedders with the same name must produce the same vectors.
    """

    @property
    def name(self) -> str: ...

    @property
    def dimensions(self) -> int: ...

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """One unit-length row per text: shape ``(len(texts), dimensions)``, dtype float32."""
        ...

    def embed_query(self, text: str) -> Vectors:
        """The unit-length vector of a search query: shape ``(dimensions,)``, dtype float32."""
        ...


# -- shared by the remote adapters (openai, voyage): parsing responses and mapping HTTP failures -----------


def rows_by_index(items: Iterable[tuple[int, Sequence[float]]], count: int, *, dimensions: int, source: str) -> Vectors:
    """The ``(index, embedding)`` pairs of a response as ``count`` unit rows in input order.

    Providers number their rows with ``index``; the order rows arrive in is not part of the contract. A row
    of the wrong width is a configuration error (the shards' ``vector(d)`` columns are sized from
    ``dimensions``); a missing, duplicated or zero row is a provider fault, worth a retry.
    """
    ordered = sorted(items, key=lambda item: item[0])
    indices = [index for index, _ in ordered]
    if indices != list(range(count)):
        raise EmbeddingProviderError(
            f"{source} returned rows numbered {indices[:8]}{'…' if len(indices) > 8 else ''} for {count} inputs"
        )
    out = np.empty((count, dimensions), dtype=np.float32)
    for position, (_, embedding) in zip(range(count), ordered, strict=True):
        if len(embedding) != dimensions:
            raise ConfigurationError(
                f"{source} returned {len(embedding)}-dimensional vectors but {dimensions} were configured; set "
                f"embedder.dimensions = {len(embedding)} (SHARDFUSE_EMBEDDER__DIMENSIONS={len(embedding)}) or "
                "pick a model that produces the configured size"
            )
        out[position] = embedding
    norms = np.linalg.norm(out.astype(np.float64), axis=1)
    if not np.all(np.isfinite(norms)) or np.any(norms == 0.0):
        raise EmbeddingProviderError(f"{source} returned a zero or non-finite vector")
    unit: Vectors = (out / norms[:, None]).astype(np.float32)
    return unit


# Statuses a client can fix, with what to change. ``{detail}`` is the provider's message.
_PERMANENT_HINTS: Mapping[int, str] = {
    400: "{source} rejected the request (HTTP 400: {detail}); an input may be empty or over the model's "
    "limits, or a parameter unsupported: check embedder.model and embedder.dimensions",
    401: "{source} rejected the API key (HTTP 401: {detail}); set a valid key in SHARDFUSE_EMBEDDER__API_KEY",
    403: "{source} does not allow this API key to use the model (HTTP 403: {detail}); check the key's "
    "permissions or embedder.model",
    404: "{source} has no such model or endpoint (HTTP 404: {detail}); check embedder.model and "
    "embedder.base_url",
    422: "{source} could not process the request (HTTP 422: {detail}); check embedder.model, "
    "embedder.dimensions and the inputs",
}
# 408 (request timeout) and 409 (lock timeout) are the server's trouble, like 5xx.
_TRANSIENT_4XX = frozenset({408, 409})


def error_for_status(
    status: int | None, detail: str, *, source: str, retry_after: float | None = None
) -> ShardfuseError:
    """Our exception for a provider's HTTP failure (``status`` None: no response at all).

    429 is :class:`RateLimitedError`; 5xx, 408, 409, no status or a non-error one are transient
    :class:`EmbeddingProviderError`; any other 4xx is a permanent :class:`EmbeddingRequestError`.
    """
    detail = " ".join(detail.split())[:300] or "no detail"
    if status == 429:
        wait = "" if retry_after is None else f"; retry after {retry_after:g}s"
        return RateLimitedError(f"{source} is rate limiting (HTTP 429: {detail}){wait}", retry_after_s=retry_after)
    # Below 400: a success status with a body that is not a response (a proxy's page), worth a retry.
    if status is None or status < 400 or status >= 500 or status in _TRANSIENT_4XX:
        code = "no response" if status is None else f"HTTP {status}"
        return EmbeddingProviderError(f"{source} failed ({code}: {detail})")
    hint = _PERMANENT_HINTS.get(status, "{source} refused the request (HTTP " + str(status) + ": {detail})")
    return EmbeddingRequestError(hint.format(source=source, detail=detail), status=status)
