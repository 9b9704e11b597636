"""Voyage AI's embeddings API via the ``voyageai`` SDK (imported when an embedder is built, not before).

The call goes through ``voyageai.Embedding.create``, the SDK resource that ``voyageai.Client.embed`` wraps:
``Client.embed`` keeps the rows but drops their ``index`` and adds a tenacity retry loop, and this adapter
needs the first and must not have the second. ``base_url`` is passed per request, as ``Client`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import SecretStr

from shardfuse.pipeline.core.errors import ConfigurationError, EmbeddingProviderError, ShardfuseError
from shardfuse.pipeline.core.http_api import Endpoint, error_for_status, retry_after_s
from shardfuse.pipeline.embed.providers.base import Vectors, rows_by_index
from shardfuse.pipeline.embed.providers.input_limits import voyage_counter, voyage_limits
from shardfuse.pipeline.embed.providers.remote import RemoteEmbedder

# Default output sizes; the models in _FLEXIBLE also return any size in _OUTPUT_DIMENSIONS on request.
NATIVE_DIMENSIONS = {
    "voyage-4-large": 1024,
    "voyage-4": 1024,
    "voyage-4-lite": 1024,
    "voyage-3-large": 1024,
    "voyage-3.5": 1024,
    "voyage-3.5-lite": 1024,
    "voyage-code-3": 1024,
    "voyage-3": 1024,
    "voyage-3-lite": 512,
    "voyage-finance-2": 1024,
    "voyage-law-2": 1024,
    "voyage-multilingual-2": 1024,
    "voyage-large-2-instruct": 1024,
    "voyage-large-2": 1536,
    "voyage-code-2": 1536,
    "voyage-2": 1024,
}
_FLEXIBLE = frozenset(
    {"voyage-4-large", "voyage-4", "voyage-4-lite", "voyage-3-large", "voyage-3.5", "voyage-3.5-lite", "voyage-code-3"}
)
_OUTPUT_DIMENSIONS = (256, 512, 1024, 2048)


class VoyageEmbedder(RemoteEmbedder):
    """Embeds with a Voyage model: ``input_type="document"`` for documents, ``"query"`` for queries.

    One request per call and no retries (backoff is the caller's backpressure layer's job); SDK exceptions
    become :class:`RateLimitedError`, :class:`EmbeddingProviderError` or :class:`EmbeddingRequestError`
    through the same status rules as every hosted API (:mod:`shardfuse.pipeline.core.http_api.failures`).
    ``truncation`` is off: :func:`~shardfuse.pipeline.embed.providers.input_limits.fit_input` decides what an
    oversize input becomes, and an input that still does not fit fails loudly instead of being cut silently
    by the server.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str = "",
        base_url: str = "",
        timeout_s: float = 30.0,
        dimensions: int | None = None,
    ) -> None:
        try:
            import voyageai.util
        except ImportError as exc:
            raise ConfigurationError(
                "the voyage embedder needs the voyageai SDK: pip install voyageai "
                "(or set embedder.provider to another provider)"
            ) from exc
        if not api_key:
            raise ConfigurationError("the voyage embedder needs an API key: set SHARDFUSE_EMBEDDER__API_KEY")
        self._provider = "voyage"
        self._model = model
        self._dimensions, self._output_dimension = _checked_dimensions(model, dimensions)
        self._limits = voyage_limits(model)
        self._counter = voyage_counter(model)
        # What voyageai.Client would pass to the resource; an empty base_url means Voyage's own endpoint
        # (which the SDK picks from the key's kind).
        url = (base_url or voyageai.util.get_default_base_url(api_key)).rstrip("/")
        self._request_params: dict[str, Any] = {"api_key": api_key, "base_url": url, "request_timeout": timeout_s}
        self._api_key = SecretStr(api_key)
        self._endpoint = Endpoint("Voyage embeddings", model, "embedder", url, parameters=("model", "dimensions"))
        self._source = str(self._endpoint)

    def __repr__(self) -> str:
        return f"VoyageEmbedder({self._model!r}, dimensions={self._dimensions})"  # never the key

    def _request(self, texts: Sequence[str], input_type: str) -> Vectors:
        return self._prepare_output(self._call(self._prepare_input(texts, input_type)), len(texts))

    # -- prepare → call → parse ------------------------------------------------------------------------
    def _prepare_input(self, texts: Sequence[str], input_type: str) -> dict[str, Any]:
        return {
            "model": self._model,
            # The API rejects empty strings; a lone space embeds "nothing" without failing the whole batch.
            "input": [text or " " for text in texts],
            "input_type": input_type,
            "truncation": False,
            "output_dimension": self._output_dimension,
            **self._request_params,
        }

    def _call(self, kwargs: dict[str, Any]) -> Any:
        from voyageai.api_resources.embedding import Embedding
        from voyageai.error import VoyageError

        try:
            return Embedding.create(**kwargs)  # type: ignore[no-untyped-call]  # the SDK's resources are unannotated
        except VoyageError as exc:
            raise _translate(exc, self._endpoint, self._api_key) from exc
        except RecursionError as exc:  # the SDK decodes the body with the json module, which recurses
            raise EmbeddingProviderError(f"{self._endpoint} answered with JSON nested too deeply to read") from exc

    def _prepare_output(self, response: Any, count: int) -> Vectors:
        try:
            items = [(int(item["index"]), item["embedding"]) for item in response["data"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise EmbeddingProviderError(f"{self._source} returned a malformed response: {exc!r}") from exc
        return rows_by_index(items, count, dimensions=self._dimensions, source=self._source)


def _checked_dimensions(model: str, dimensions: int | None) -> tuple[int, int | None]:
    """The vector size, and the ``output_dimension`` to request (None: the model's default)."""
    native = NATIVE_DIMENSIONS.get(model)
    if dimensions is None:
        if native is None:
            raise ConfigurationError(
                f"unknown Voyage embedding model {model!r}: set embedder.dimensions to the size it produces"
            )
        return native, None
    if native is None or dimensions == native:
        return dimensions, None
    if model in _FLEXIBLE and dimensions in _OUTPUT_DIMENSIONS:
        return dimensions, dimensions
    sizes = " or ".join(map(str, _OUTPUT_DIMENSIONS)) if model in _FLEXIBLE else str(native)
    raise ConfigurationError(f"{model} produces {sizes}-dimensional vectors; set embedder.dimensions to one of them")


def _translate(exc: Exception, endpoint: Endpoint, api_key: SecretStr) -> ShardfuseError:
    """Our exception for a voyageai exception (the SDK made exactly one attempt)."""
    from voyageai import error

    if isinstance(exc, error.Timeout):
        return EmbeddingProviderError(f"{endpoint} timed out: {exc}")
    if isinstance(exc, error.APIConnectionError):
        return EmbeddingProviderError(f"{endpoint} could not be reached: {exc}")
    status = getattr(exc, "http_status", None)
    headers = getattr(exc, "headers", None)
    detail = str(getattr(exc, "user_message", None) or exc)
    if isinstance(exc, error.AuthenticationError) and status is None:
        status = 401  # raised before any request: no key at all
    wait = retry_after_s(dict(headers.items())) if headers else None
    return error_for_status(
        status if isinstance(status, int) else None, detail, endpoint=endpoint, retry_after=wait, api_key=api_key
    )
