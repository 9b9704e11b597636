"""A deterministic, model-free embedder for tests: signed feature hashing of words and word bigrams."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from itertools import chain
from typing import cast

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.core.words import words as words_of
from shardfuse.pipeline.embed.providers.base import Vectors

# Bigrams add a little word-order signal; weighted lower so shared words dominate similarity.
_BIGRAM_WEIGHT = 0.5
# Word digests remembered: words repeat across a corpus, and a blake2b digest costs far more than the
# lookup. Cleared when full (about 20 MB at this size).
WORD_CACHE_SIZE = 200_000
# A bigram's digest is derived from its two words' digests (multiply by the 64-bit golden ratio, xor, then
# splitmix64's finaliser), vectorised over the text: no per-bigram string or blake2b.
_GOLDEN = np.uint64(0x9E37_79B9_7F4A_7C15)
_MIX = (np.uint64(30), np.uint64(0xBF58_476D_1CE4_E5B9), np.uint64(27), np.uint64(0x94D0_49BB_1331_11EB),
        np.uint64(31))
_LOW_63 = np.uint64(0x7FFF_FFFF_FFFF_FFFF)
_TOP_BIT = np.uint64(63)


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
        self._digests: dict[str, int] = {}

    @property
    def name(self) -> str:
        # Versioned so that a change to the hashing scheme cannot mix with vectors already cached
        # (v2: bigram digests derived from the words' digests).
        return f"hashing:v2:{self._dimensions}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """One unit-length row per text, shape ``(len(texts), dimensions)``, computed for the whole batch in one
        pass of numpy (a pass per text cost ~20 µs of numpy calls: 25 % of an embed of SciFact-sized chunks,
        session 27). A text's row does not depend on the other texts of its batch."""
        count, dimensions = len(texts), self._dimensions
        per_text = [self._word_digests(text) for text in texts]
        lengths = np.fromiter(map(len, per_text), dtype=np.int64, count=count)
        words = int(lengths.sum())
        digests = np.fromiter(chain.from_iterable(per_text), dtype=np.uint64, count=words)
        rows = np.repeat(np.arange(count, dtype=np.int64), lengths)
        within = rows[:-1] == rows[1:]  # the bigrams that do not span two texts
        features = np.concatenate([digests, bigram_digests(digests)[within]])
        weights = np.where(features >> _TOP_BIT, -1.0, 1.0)  # the top bit picks the sign: collisions cancel
        weights[words:] *= _BIGRAM_WEIGHT
        buckets = ((features & _LOW_63) % np.uint64(dimensions)).astype(np.int64)
        cells = np.concatenate([rows, rows[:-1][within]]) * dimensions + buckets
        # Sums of ±1 and ±0.5, and their squares, are exact in float64: any order of summation gives the
        # same vectors and norms, whatever else is in the batch.
        vectors = np.bincount(cells, weights=weights, minlength=count * dimensions).reshape(count, dimensions)
        norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))
        out = np.empty((count, dimensions), dtype=np.float32)
        found = norms > 0.0
        out[found] = (vectors[found] / norms[found, None]).astype(np.float32)
        out[~found] = self._fallback
        return out

    def embed_query(self, text: str) -> Vectors:
        """The unit-length vector of ``text``, shape ``(dimensions,)``."""
        row: Vectors = self.embed_documents([text])[0]
        return row

    def _word_digests(self, text: str) -> list[int]:
        found = words_of(text.lower())
        if len(self._digests) + len(found) > WORD_CACHE_SIZE:
            self._digests.clear()
        digests = list(map(self._digests.get, found))  # at C speed: most words are known
        if None in digests:
            for at, digest in enumerate(digests):
                if digest is None:
                    digests[at] = self._digests[found[at]] = word_digest(found[at])
        return cast(list[int], digests)  # every None was filled


def word_digest(word: str) -> int:
    """A word's 64-bit feature digest (blake2b, big-endian)."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "big")


def bigram_digests(words: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The digest of each pair of consecutive words, from the words' digests (uint64 arithmetic wraps)."""
    z = (words[:-1] * _GOLDEN) ^ words[1:]
    shift_1, multiply_1, shift_2, multiply_2, shift_3 = _MIX
    z = (z ^ (z >> shift_1)) * multiply_1
    z = (z ^ (z >> shift_2)) * multiply_2
    return z ^ (z >> shift_3)
