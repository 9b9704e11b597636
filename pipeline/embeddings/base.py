"""The embedding port: what every embedding provider adapter looks like."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

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
