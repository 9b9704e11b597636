"""The embedding port: what every embedding provider adapter looks like."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.core.errors import ConfigurationError, EmbeddingProviderError

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


# -- shared by the remote adapters (openai, voyage): reading the rows of a response ---------------------------


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
