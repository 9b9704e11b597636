"""The ``/rerank`` HTTP APIs of Cohere, Jina and Hugging Face's text-embeddings-inference (TEI), on httpx.

Two shapes, one adapter (prepare → call → parse):

- Cohere and Jina: ``POST {base}/v1/rerank {model, query, documents, top_n}`` →
  ``{"results": [{"index", "relevance_score"}, ...]}``, the key as ``Authorization: Bearer``;
- TEI: ``POST {base}/rerank {query, texts, truncate}`` → ``[{"index", "score"}, ...]`` (the server's one model).

Plain HTTP rather than each vendor's SDK: the request is one JSON object and the answer a list of pairs, and
one client with one timeout is what the budget needs. Each call makes one request with what is left of the
budget as its timeout (connect, send and each read alike); retrying is the stage's job. Failures are
translated as every hosted API's are (:func:`~shardfuse.pipeline.core.http_api.error_for_status`: 429 with its
``Retry-After``, 5xx, other 4xx), plus a timeout (:class:`RerankTimeoutError`) and an answer that does not
parse (:class:`MalformedRerankError`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr

from shardfuse.pipeline.core import json_depth
from shardfuse.pipeline.core.errors import EmbeddingProviderError
from shardfuse.pipeline.core.http_api import Endpoint, error_for_status, retry_after_s
from shardfuse.query.rerank.port import MalformedRerankError, RerankTimeoutError, scores_by_index


@dataclass(frozen=True, slots=True)
class RerankApi:
    """One ``/rerank`` dialect: where it posts, what it sends, where the scores are in the answer."""

    api: str  # as messages name it
    path: str
    body: Callable[[str, str, Sequence[str]], dict[str, Any]]  # (model, query, texts) -> JSON
    pairs: Callable[[Any], list[tuple[object, object]]]  # the answer's JSON -> (index, score) pairs


def _results(payload: Any) -> list[tuple[object, object]]:
    return [(item["index"], item["relevance_score"]) for item in payload["results"]]


def _tei_pairs(payload: Any) -> list[tuple[object, object]]:
    return [(item["index"], item["score"]) for item in payload]


COHERE = RerankApi(
    "Cohere rerank", "/v1/rerank",
    lambda model, query, texts: {"model": model, "query": query, "documents": list(texts), "top_n": len(texts)},
    _results,
)
JINA = RerankApi(
    "Jina rerank", "/v1/rerank",
    lambda model, query, texts: {"model": model, "query": query, "documents": list(texts), "top_n": len(texts),
                                 "return_documents": False},
    _results,
)
TEI = RerankApi(
    "TEI rerank", "/rerank",
    # truncate: the server cuts a text over its model's limit instead of refusing the whole request.
    lambda model, query, texts: {"query": query, "texts": list(texts), "truncate": True},
    _tei_pairs,
)
APIS = {"cohere": COHERE, "jina": JINA, "tei": TEI}


class HttpReranker:
    """Scores through one ``/rerank`` API. Thread-safe (one pooled httpx client); :meth:`close` it."""

    def __init__(self, api: RerankApi, *, provider: str, model: str, base_url: str, api_key: SecretStr) -> None:
        self._api = api
        self._model = model
        self._api_key = api_key
        self._url = base_url.rstrip("/") + api.path
        self._endpoint = Endpoint(api.api, model or "the server's model", "rerank", base_url)
        self._name = f"{provider}:{model}" if model else provider
        headers = {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key.get_secret_value() else {}
        self._client = httpx.Client(headers=headers)

    def __repr__(self) -> str:
        return f"HttpReranker({str(self._endpoint)!r})"  # never the key

    @property
    def name(self) -> str:
        return self._name

    def rerank(self, query: str, texts: Sequence[str], *, timeout_s: float) -> list[float]:
        payload = self._call(self._api.body(self._model, query, texts), timeout_s=timeout_s)
        return self._parse(payload, len(texts))

    def close(self) -> None:
        self._client.close()

    def _call(self, body: dict[str, Any], *, timeout_s: float) -> Any:
        try:
            response = self._client.post(self._url, json=body, timeout=httpx.Timeout(timeout_s))
        except httpx.TimeoutException as exc:
            raise RerankTimeoutError(f"{self._endpoint} timed out after {timeout_s:.3g}s") from exc
        except httpx.HTTPError as exc:  # refused, reset, a broken protocol: no answer at all
            raise EmbeddingProviderError(f"{self._endpoint} could not be reached: {type(exc).__name__}: {exc}") from exc
        if not response.is_success:
            raise error_for_status(response.status_code, _detail(response), endpoint=self._endpoint,
                                   retry_after=retry_after_s(dict(response.headers.items())), api_key=self._api_key)
        try:
            return json_depth.loads(response.content)
        except json_depth.TooDeepError as exc:
            raise MalformedRerankError(f"{self._endpoint} answered with JSON that {exc}") from exc
        except ValueError as exc:
            raise MalformedRerankError(f"{self._endpoint} answered with something other than JSON: "
                                       f"{response.text[:120]!r}") from exc

    def _parse(self, payload: Any, count: int) -> list[float]:
        try:
            pairs = self._api.pairs(payload)
        except (KeyError, TypeError, IndexError) as exc:
            raise MalformedRerankError(f"{self._endpoint} answered without scores ({type(exc).__name__}: {exc}): "
                                       f"{str(payload)[:120]!r}") from exc
        return scores_by_index(pairs, count, source=str(self._endpoint))


def _detail(response: httpx.Response) -> str:
    """What the server said: Cohere's ``message``, Jina's ``detail``, TEI's ``error``, else the body."""
    try:
        payload = json_depth.loads(response.content)
    except ValueError:
        return response.text
    if isinstance(payload, dict):
        for key in ("message", "detail", "error"):
            if payload.get(key):
                return str(payload[key])
    return str(payload)
