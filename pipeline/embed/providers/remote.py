"""What the remote provider adapters (OpenAI, Voyage) share: their name, size, declared limits and token
counter, and ``embed_documents`` as check → prepare → call → parse for a non-empty batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardfuse.pipeline.embed.providers.base import Vectors
from shardfuse.pipeline.embed.providers.input_limits import ProviderLimits, TiktokenCounter, check_request

DOCUMENT = "document"
QUERY = "query"


class RemoteEmbedder:
    """Subclasses set the attributes below in ``__init__`` and implement :meth:`_request` (one provider call
    for texts already checked against the limits)."""

    _provider: str
    _model: str
    _dimensions: int
    _limits: ProviderLimits
    _counter: TiktokenCounter
    _source: str

    @property
    def name(self) -> str:
        # Shortened vectors (dimensions below the model's native size) are a different space from full ones.
        return f"{self._provider}:{self._model}:{self._dimensions}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @property
    def limits(self) -> ProviderLimits:
        return self._limits

    @property
    def counter(self) -> TiktokenCounter:
        return self._counter

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """One unit row per text, in input order. Raises ValueError when ``texts`` exceed :attr:`limits`."""
        if not texts:
            return np.empty((0, self._dimensions), dtype=np.float32)
        return self._embed(texts, DOCUMENT)

    def embed_query(self, text: str) -> Vectors:
        """The unit vector of ``text`` embedded as a query, shape ``(dimensions,)``."""
        return self._embed([text], QUERY).reshape(self._dimensions)

    def _embed(self, texts: Sequence[str], input_type: str) -> Vectors:
        check_request(texts, self._counter, self._limits, source=self._source)
        return self._request(texts, input_type)

    def _request(self, texts: Sequence[str], input_type: str) -> Vectors:
        raise NotImplementedError
