"""A shard search's top-k cut: the positions of the ``k`` best positive scores of a shard's score array."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# Every how-many-th score :func:`top_positions` samples for a floor under the k-th highest (16 was the fastest of
# 8, 16 and sqrt(scores / k) at k 30 and 150, session 25).
SAMPLE_STRIDE = 16


def top_positions(scores: npt.NDArray[np.float32], k: int, ids: npt.NDArray[np.str_]) -> npt.NDArray[np.int64]:
    """Positions of the ``k`` highest scores above zero (fewer when fewer score), unordered; among equal
    scores at the cut, the lowest chunk ids (``ids``, by position), as the hits are ordered after.

    Only positions that can be among the best are partitioned. The ``k``-th highest score of every
    ``SAMPLE_STRIDE``-th position is a floor the ``k``-th highest of all cannot be below, so only scores at or
    above it are candidates (about ``k × SAMPLE_STRIDE`` of them); with fewer than ``k`` scoring positions in
    the sample, every scoring position is. ``np.partition`` over a whole shard's scores, most of them zero, is
    pathologically slow (1.95 ms for 25,000 scores of which 3,000 are non-zero, numpy 2, this machine); over
    the scoring ones it took 113 µs a shard-search on SciFact queries, against 35 µs with the sample's floor
    (session 25). The ``k``-th highest candidate is found by ``np.partition`` (no index array: half the cost of
    ``argpartition``), every candidate at or above it kept, and only when ties at that score leave more than
    ``k`` are they ordered by score and id.
    """
    if k <= 0 or len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    sample = scores[::SAMPLE_STRIDE]
    sampled = sample[sample > 0]
    if len(sampled) >= k:
        best = np.flatnonzero(scores >= np.partition(sampled, len(sampled) - k)[len(sampled) - k])
    else:
        best = np.flatnonzero(scores > 0)
    if len(best) > k:
        scored = scores[best]
        best = best[scored >= np.partition(scored, len(scored) - k)[len(scored) - k]]
        if len(best) > k:
            best = best[np.lexsort((ids[best], -scores[best]))[:k]]
    return best
