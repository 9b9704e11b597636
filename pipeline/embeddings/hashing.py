"""A deterministic, model-free embedder for tests: signed feature hashing of words and word bigrams."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence

import numpy as np

from pipeline.embeddings.base import Vectors

_WORD = re.compile(r"\w+")
# Bigrams add a little word-order signal; weighted lower so shared words dominate similarity.
_BIGRAM_WEIGHT = 0.5


class HashingEmbedder:
    """Hashes lower-cased words and word bigrams into ``dimensions`` signed buckets, then L2-normalises.

    The hash is blake2b, not :func:`hash`, whose value changes between processes (PYTHONHASHSEED): vectors
    must be identical across workers and runs, since they are cached and compared across processes.
    """

    def __init__(self, dimensions: int) -> None:
        if dimensions < 1:
            raise ValueError(f"dimensions must be positive, got {dimensions}")
        self._dimensions = dimensions
        # A text with no words (or whose features cancel out) would be the zero vector, whose cosine
        # distance is NaN in pgvector and poisons rankings. Give it a fixed unit vector instead: equally,
        # and weakly, similar to everything.
        self._fallback = np.full(dimensions, 1.0 / math.sqrt(dimensions), dtype=np.float32)

    @property
    def name(self) -> str:
        # Versioned so that a change to the hashing scheme cannot mix with vectors already cached.
        return f"hashing:v1:{self._dimensions}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """One unit-length row per text, shape ``(len(texts), dimensions)``."""
        out = np.empty((len(texts), self._dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row] = self._embed(text)
        return out

    def embed_query(self, text: str) -> Vectors:
        """The unit-length vector of ``text``, shape ``(dimensions,)``."""
        return self._embed(text)

    def _embed(self, text: str) -> Vectors:
        vector = np.zeros(self._dimensions, dtype=np.float64)
        words = _WORD.findall(text.lower())
        features = [(w, 1.0) for w in words]
        features += [(f"{a} {b}", _BIGRAM_WEIGHT) for a, b in zip(words, words[1:], strict=False)]
        for feature, weight in features:
            bucket, sign = self._bucket(feature)
            vector[bucket] += sign * weight
        norm = float(np.linalg.norm(vector))
        if norm == 0.0:
            return self._fallback.copy()
        return (vector / norm).astype(np.float32)

    def _bucket(self, feature: str) -> tuple[int, float]:
        digest = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "big")
        # The top bit picks the sign, so collisions cancel on average instead of piling up.
        return (digest & 0x7FFF_FFFF_FFFF_FFFF) % self._dimensions, (-1.0 if digest >> 63 else 1.0)
