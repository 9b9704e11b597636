"""One loaded generation of a shard's BM25 index, with its delta segment, and how a query searches it.

The generation's stored scores carry the IDF of its own documents. With a delta (``delta.py``), the live
documents are the generation's minus the masked rows, plus the delta's: every term's IDF is taken over
those (or over the zone's statistics summed across shards, when the query brings them), the generation's
stored scores are rescaled to it, the delta's IDF-free weights multiplied by it, the masked rows zeroed,
and the two top-k lists merged.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.index.lexical.delta import DeltaSegment
from shardfuse.pipeline.index.lexical.hits import LexicalHit
from shardfuse.pipeline.index.lexical.manifest import ShardManifest
from shardfuse.pipeline.index.lexical.stats import TermStats, lucene_idf
from shardfuse.pipeline.index.lexical.top_k import top_positions

# What identifies one version of MANIFEST.json without reading it: os.replace gives every publish a new
# inode, and mtime/ctime/size guard against the filesystem reusing a freed inode number.
StatKey = tuple[int, int, int, int, int]


class MaskCache:
    """Per-zone bm25s weight masks of one generation, least recently used first out.

    Bounded in bytes, not entries: a mask is 4 bytes per document, so a fixed entry count would cost
    gigabytes on a large shard with many tenants.
    """

    def __init__(self, *, codes: npt.NDArray[np.int32], max_bytes: int) -> None:
        self._codes = codes
        self._max_entries = max(1, max_bytes // max(1, 4 * len(codes)))
        self._masks: OrderedDict[int, npt.NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, code: int) -> npt.NDArray[np.float32]:
        with self._lock:
            cached = self._masks.get(code)
            if cached is not None:
                self._masks.move_to_end(code)
                return cached
        # Built outside the lock: two threads may build the same mask once, which is cheaper than making
        # every other zone's searches wait for it.
        mask: npt.NDArray[np.float32] = (self._codes == code).astype(np.float32)
        with self._lock:
            self._masks[code] = mask
            while len(self._masks) > self._max_entries:
                self._masks.popitem(last=False)
        return mask


class Positions:
    """chunk id → bm25s document position of one generation, built on the first filtered search."""

    def __init__(self, chunk_ids: npt.NDArray[np.str_]) -> None:
        self._chunk_ids = chunk_ids
        self._index: dict[str, int] | None = None
        self._lock = threading.Lock()

    def of(self, chunk_ids: Collection[str]) -> npt.NDArray[np.int64]:
        with self._lock:
            if self._index is None:
                self._index = {str(c): i for i, c in enumerate(self._chunk_ids.tolist())}
            index = self._index
        return np.fromiter((index[c] for c in chunk_ids if c in index), dtype=np.int64)


@dataclass(frozen=True)
class Generation:
    """Everything a search needs from one generation and its delta; immutable apart from the caches."""

    key: StatKey | None
    manifest: ShardManifest | None
    retriever: Any = None  # bm25s.BM25 (untyped library); None when the generation cannot match anything
    chunk_ids: npt.NDArray[np.str_] | None = None
    zone_codes: npt.NDArray[np.int32] | None = None
    zone_index: dict[str, int] = field(default_factory=dict)
    zone_sizes: dict[int, int] = field(default_factory=dict)
    masks: MaskCache | None = None
    positions: Positions | None = None
    delta: DeltaSegment | None = None
    delta_positions: Positions | None = None

    def with_key(self, key: StatKey | None) -> Generation:
        return replace(self, key=key)

    def with_delta(self, key: StatKey | None, manifest: ShardManifest, delta: DeltaSegment | None) -> Generation:
        """The same generation (its mapped files and caches) with another delta."""
        positions = Positions(delta.chunk_ids) if delta is not None else None
        return replace(self, key=key, manifest=manifest, delta=delta, delta_positions=positions)

    def _whole_shard(self, code: int) -> bool:
        """Whether zone ``code`` holds every row of the generation (one zone per shard, the common case):
        its mask is all ones, and counting its rows in a posting list is the list's length."""
        return self.zone_codes is not None and self.zone_sizes.get(code, -1) == len(self.zone_codes)

    def _base_df(self, token: str, code: int | None) -> tuple[int, int]:
        """(rows of zone ``code`` — every zone when None — holding ``token``, of them masked by the delta)."""
        if self.retriever is None or self.zone_codes is None:
            return 0, 0
        token_id = self.retriever.vocab_dict.get(token)
        if token_id is None:
            return 0, 0
        indptr, indices = self.retriever.scores["indptr"], self.retriever.scores["indices"]
        docs = indices[indptr[token_id] : indptr[token_id + 1]]
        if code is None or self._whole_shard(code):
            df = len(docs)
        else:
            df = int(np.count_nonzero(self.zone_codes[docs] == code))
        masked = self.delta.masked_df(docs, base_code=code) if self.delta is not None else 0
        return df, masked

    def term_stats(self, tokens: list[str], *, zone: str) -> TermStats:
        """How many of ``zone``'s live documents this shard holds, and how many contain each token."""
        code = self.zone_index.get(zone) if self.retriever is not None else None
        delta = self.delta
        docs = self.zone_sizes.get(code, 0) if code is not None else 0
        if delta is not None:
            docs += delta.zone_sizes.get(delta.zone_index.get(zone, -1), 0) - delta.masked_in_zone(code)
        if docs <= 0:
            return TermStats()
        df: dict[str, int] = {}
        for token in set(tokens):
            base, masked = self._base_df(token, code) if code is not None else (0, 0)
            count = base - masked + (delta.df(token, zone=zone) if delta is not None else 0)
            if count > 0 or (self.retriever is not None and token in self.retriever.vocab_dict):
                df[token] = count
        return TermStats(docs=docs, df=df)

    def _live_idf(self, token: str) -> float:
        """The token's IDF over the shard's live documents (every zone), as a full build would bake it."""
        assert self.delta is not None
        base_docs = int(self.retriever.scores["num_docs"]) if self.retriever is not None else 0
        docs = base_docs - self.delta.masked_rows.size + self.delta.size
        base, masked = self._base_df(token, None)
        return lucene_idf(base - masked + self.delta.df(token), docs)

    def search(
        self,
        tokens: list[str],
        *,
        zone: str,
        k: int,
        allowed: Collection[str] | None = None,
        stats: TermStats | None = None,
    ) -> list[LexicalHit]:
        counts = Counter(tokens)
        hits = self._search_base(counts, zone=zone, k=k, allowed=allowed, stats=stats)
        if self.delta is not None:
            hits += self._search_delta(self.delta, counts, zone=zone, k=k, allowed=allowed, stats=stats)
        # Deterministic order among equal scores, so repeated queries fuse identically.
        hits.sort(key=lambda hit: (-hit.score, hit.chunk_id))
        return hits[:k]

    def _target_idf(self, token: str, stats: TermStats | None) -> float | None:
        """The IDF the token's scores must carry; None: the generation's baked one, as stored."""
        if stats is not None and stats.docs > 0:
            return stats.idf(token)
        return self._live_idf(token) if self.delta is not None else None

    def _search_base(self, counts: Counter[str], *, zone: str, k: int, allowed: Collection[str] | None,
                     stats: TermStats | None) -> list[LexicalHit]:
        if self.retriever is None or self.masks is None or self.chunk_ids is None or self.zone_codes is None:
            return []
        code = self.zone_index.get(zone)
        if code is None:
            return []
        weights = self._term_weights(counts, stats)
        if not weights:
            return []
        # Only the zone's own documents can score above zero under its mask, so asking for more than the
        # zone holds is wasted sorting.
        top = min(k, self.zone_sizes[code])
        if allowed is not None and self.positions is not None:
            # A filter narrows the mask itself, before the top-k cut: the zone's best *matching* chunks.
            mask = self.masks.get(code)
            keep = self.positions.of(allowed)
            narrowed = np.zeros_like(mask)
            narrowed[keep] = mask[keep]
            top = min(top, len(keep))
            if top == 0:
                return []
            scores = self._scores(weights) * narrowed
        elif self._whole_shard(code):
            scores = self._scores(weights)  # the zone's mask is all ones
        else:
            scores = self._scores(weights) * self.masks.get(code)
        if self.delta is not None and self.delta.masked_rows.size:
            # Rows of documents rewritten or deleted since the generation: the delta holds what is current.
            scores[self.delta.masked_rows] = 0.0
        best = top_positions(scores, top, self.chunk_ids)
        hits: list[LexicalHit] = []
        for doc, score in zip(best.tolist(), scores[best].tolist(), strict=True):
            # top_positions keeps positive scores only, and the mask zeroes every other zone's, so the zone check never
            # drops a hit; it stays as the guarantee that no query ever sees another zone's chunk.
            if int(self.zone_codes[doc]) == code:
                hits.append(LexicalHit(str(self.chunk_ids[doc]), float(score)))
        return hits

    def _search_delta(self, delta: DeltaSegment, counts: Counter[str], *, zone: str, k: int,
                      allowed: Collection[str] | None, stats: TermStats | None) -> list[LexicalHit]:
        code = delta.zone_index.get(zone)
        if code is None:
            return []
        scores = np.zeros(delta.size, dtype=np.float32)
        for token, count in counts.items():
            found = delta.postings(token)
            if found is None:
                continue
            idf = self._target_idf(token, stats)
            assert idf is not None
            scores[found[0]] += np.float32(count * idf) * found[1]
        live = delta.zone_codes == code
        if allowed is not None and self.delta_positions is not None:
            keep = np.zeros(delta.size, dtype=bool)
            keep[self.delta_positions.of(allowed)] = True
            live &= keep
        scores[~live] = 0.0
        best = top_positions(scores, min(k, delta.size), delta.chunk_ids)
        return [LexicalHit(str(delta.chunk_ids[d]), float(s))
                for d, s in zip(best.tolist(), scores[best].tolist(), strict=True)]

    def _term_weights(self, counts: Counter[str], stats: TermStats | None) -> dict[int, float]:
        """Per known token id, the factor its stored scores are summed with.

        A token repeated in the query counts once per occurrence, as in bm25s. With zone-wide ``stats`` (or a
        delta), the factor also swaps the generation's baked-in IDF for the right one.
        """
        assert self.retriever is not None
        vocab: dict[str, int] = self.retriever.vocab_dict
        indptr = self.retriever.scores["indptr"]
        shard_docs = int(self.retriever.scores["num_docs"])
        weights: dict[int, float] = {}
        for token, count in counts.items():
            token_id = vocab.get(token)
            if token_id is None:
                continue
            weight = float(count)
            target = self._target_idf(token, stats)
            if target is not None:
                shard_df = int(indptr[token_id + 1] - indptr[token_id])
                weight *= target / lucene_idf(shard_df, shard_docs)
            weights[token_id] = weight
        return weights

    def _scores(self, weights: dict[int, float]) -> npt.NDArray[np.float32]:
        """Every document's BM25 score for the weighted tokens: a sum of sparse columns of the score matrix.

        One ``bincount`` over the columns laid end to end (summed in float64, then stored as float32): 2.4x
        faster than adding column after column into the score array (SciFact queries, 25,000-row shards). The
        columns' values are weighted in one multiplication by each token's weight repeated over its column
        (67 against 85 µs a shard-search with a product per column, session 25).
        """
        assert self.retriever is not None
        matrix = self.retriever.scores
        data, indices, indptr = matrix["data"], matrix["indices"], matrix["indptr"]
        if not weights:
            return np.zeros(int(matrix["num_docs"]), dtype=np.float32)
        spans = [(int(indptr[token_id]), int(indptr[token_id + 1])) for token_id in weights]
        rows = np.concatenate([indices[start:end] for start, end in spans])
        values = np.concatenate([data[start:end] for start, end in spans])
        values *= np.repeat(np.fromiter(weights.values(), dtype=np.float32, count=len(weights)),
                            [end - start for start, end in spans])
        return np.bincount(rows, weights=values, minlength=int(matrix["num_docs"])).astype(np.float32)
