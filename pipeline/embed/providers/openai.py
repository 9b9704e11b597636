"""OpenAI's embeddings API (or any server speaking it, through ``base_url``), via the ``openai`` SDK."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import SecretStr

from shardfuse.pipeline.core.errors import ConfigurationError, EmbeddingProviderError
from shardfuse.pipeline.core.http_api import Endpoint, OpenAIApi
from shardfuse.pipeline.embed.providers.base import Vectors, rows_by_index
from shardfuse.pipeline.embed.providers.input_limits import OPENAI_LIMITS, openai_counter
from shardfuse.pipeline.embed.providers.remote import RemoteEmbedder

if TYPE_CHECKING:
    import openai
    from openai.types import CreateEmbeddingResponse

# Native sizes. text-embedding-3-* can return fewer dimensions (the API's ``dimensions``); ada-002 cannot.
NATIVE_DIMENSIONS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
_SHORTENABLE_PREFIX = "text-embedding-3-"


class OpenAIEmbedder(RemoteEmbedder):
    """Embeds through :class:`~shardfuse.pipeline.core.http_api.OpenAIApi`: one request per call, no retries.

    Backoff, concurrency and rate limits belong to the caller's backpressure layer, which needs to see every
    429 as it happens; the shared client raises :class:`RateLimitedError`, :class:`EmbeddingProviderError`
    (transient) or :class:`EmbeddingRequestError` (permanent), naming ``embedder.*`` settings.

    ``dimensions`` defaults to the model's native size; a smaller size is requested from the API for
    text-embedding-3-* models. An unknown model (an OpenAI-compatible server) needs ``dimensions`` and is
    checked against the first response instead.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str = "",
        base_url: str = "",
        dimensions: int | None = None,
        timeout_s: float = 30.0,
        client: openai.OpenAI | None = None,
    ) -> None:
        self._provider = "openai"
        self._model = model
        self._dimensions = _checked_dimensions(model, dimensions)
        # Only text-embedding-3-* accept the parameter; others answer 400 even for their native size.
        self._send_dimensions = model.startswith(_SHORTENABLE_PREFIX)
        self._limits = OPENAI_LIMITS
        self._counter = openai_counter(model)
        if not api_key and client is None:
            raise ConfigurationError(
                "the openai embedder needs an API key: set SHARDFUSE_EMBEDDER__API_KEY (any non-empty value for "
                "a compatible server that ignores keys)"
            )
        endpoint = Endpoint("OpenAI embeddings", model, "embedder", base_url, parameters=("model", "dimensions"))
        self._api = OpenAIApi(endpoint, api_key=SecretStr(api_key), timeout_s=timeout_s, client=client)
        self._api.warm_up()  # the SDK's import belongs to the worker's start-up, not to its first batch
        self._source = str(endpoint)

    def _request(self, texts: Sequence[str], input_type: str) -> Vectors:
        # OpenAI embeds queries like documents.
        return self._prepare_output(self._api.embeddings(**self._prepare_input(texts)), len(texts))

    # -- prepare → call → parse ------------------------------------------------------------------------
    def _prepare_input(self, texts: Sequence[str]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self._model,
            # The API rejects empty strings; a lone space embeds "nothing" without failing the whole batch.
            "input": [text or " " for text in texts],
            # Base64 float32 rows: a fraction of the JSON and no per-float parsing in the SDK (which is what it
            # asks for itself when no format is given). A compatible server that ignores it sends float lists.
            "encoding_format": "base64",
        }
        if self._send_dimensions:
            kwargs["dimensions"] = self._dimensions
        return kwargs

    def _prepare_output(self, response: CreateEmbeddingResponse, count: int) -> Vectors:
        try:
            items = [(item.index, _decoded(item.embedding)) for item in response.data]
        except (AttributeError, TypeError) as exc:
            raise EmbeddingProviderError(f"{self._source} returned a malformed response: {exc}") from exc
        return rows_by_index(items, count, dimensions=self._dimensions, source=self._source)


def _decoded(embedding: str | Sequence[float]) -> Sequence[float]:
    """One row as sent: base64 little-endian float32, or a list of floats."""
    if not isinstance(embedding, str):
        return embedding
    try:
        raw = base64.b64decode(embedding, validate=True)
    except binascii.Error as exc:
        raise EmbeddingProviderError(f"an embedding row is not valid base64: {exc}") from exc
    if len(raw) % 4:
        raise EmbeddingProviderError(f"an embedding row of {len(raw)} bytes is not a float32 array")
    return np.frombuffer(raw, dtype="<f4")  # type: ignore[return-value]


def _checked_dimensions(model: str, dimensions: int | None) -> int:
    native = NATIVE_DIMENSIONS.get(model)
    if dimensions is None:
        if native is None:
            raise ConfigurationError(
                f"unknown OpenAI embedding model {model!r}: set embedder.dimensions to the size it produces"
            )
        return native
    if dimensions < 1:
        raise ConfigurationError(f"embedder.dimensions must be positive, got {dimensions}")
    if native is not None and dimensions != native:
        if not model.startswith(_SHORTENABLE_PREFIX):
            raise ConfigurationError(
                f"{model} only produces {native}-dimensional vectors; set embedder.dimensions = {native}"
            )
        if dimensions > native:
            raise ConfigurationError(
                f"{model} produces at most {native} dimensions; set embedder.dimensions to {native} or fewer"
            )
    return dimensions
