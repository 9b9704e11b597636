"""Which document a BM25 row belongs to: a 64-bit hash of its ``(zone, path)``.

A generation stores one per row (``doc_keys.npy``), so a delta segment can find, in O(k log n), the base
rows of the k documents written since the generation was built and mask them out. A collision (odds about
n²/2⁶⁵) would only mask one extra unchanged document until the next merge.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt


def doc_key(zone: str, path: str) -> int:
    """The 64-bit key of document ``(zone, path)``."""
    digest = hashlib.blake2b(f"{zone}\x00{path}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def doc_key_array(zones: Sequence[str], paths: Sequence[str]) -> npt.NDArray[np.uint64]:
    """Per row, the key of its document."""
    cache: dict[tuple[str, str], int] = {}
    keys = np.empty(len(zones), dtype=np.uint64)
    for i, pair in enumerate(zip(zones, paths, strict=True)):
        key = cache.get(pair)
        if key is None:
            key = cache[pair] = doc_key(*pair)
        keys[i] = key
    return keys


def rows_of(doc_keys: npt.NDArray[np.uint64], order: npt.NDArray[np.int64],
            wanted: Iterable[int]) -> npt.NDArray[np.int64]:
    """The rows whose key is in ``wanted``, sorted; ``order`` is ``argsort(doc_keys, kind="stable")``.

    Binary search over the sorted view: O(k log n), so masking k documents costs the same in any shard.
    """
    targets = np.unique(np.fromiter(wanted, dtype=np.uint64))
    if targets.size == 0 or doc_keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    sorted_keys = doc_keys[order]
    lo = np.searchsorted(sorted_keys, targets, side="left")
    hi = np.searchsorted(sorted_keys, targets, side="right")
    spans = [order[a:b] for a, b in zip(lo.tolist(), hi.tolist(), strict=True) if b > a]
    if not spans:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.concatenate(spans).astype(np.int64))
