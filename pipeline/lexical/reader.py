"""Search one shard's published BM25 index, following new generations as they are published.

A query worker holds one :class:`LexicalShardReader` per shard, created at worker start-up. Each search
costs one ``stat`` of ``MANIFEST.json`` to notice a new generation (publishing replaces the file, so its
inode changes); only then is the manifest re-read and the new generation mapped. Searches run on a local
reference to the generation they started with, so a swap never pulls arrays from under a running search.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import numpy.typing as npt

from pipeline.errors import InvalidQueryError, PermanentError, StoreUnavailableError
from pipeline.lexical.hits import LexicalHit
from pipeline.lexical.layout import (
    CHUNK_IDS_FILE,
    ZONE_CODES_FILE,
    ZONE_NAMES_FILE,
    manifest_path,
    shard_dir,
)
from pipeline.lexical.manifest import ShardManifest, read_manifest
from pipeline.lexical.stats import TermStats, lucene_idf
from pipeline.lexical.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# What identifies one version of MANIFEST.json without reading it: os.replace gives every publish a new
# inode, and mtime/ctime/size guard against the filesystem reusing a freed inode number.
_StatKey = tuple[int, int, int, int, int]

# A generation can vanish between reading the manifest and mapping its files when builders publish twice
# in that window and collect it; the manifest has moved on by then, so re-reading it a few times converges.
_LOAD_ATTEMPTS = 3

_DEFAULT_MASK_CACHE_BYTES = 64 * 1024 * 1024


class _MaskCache:
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


class _Positions:
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
class _Generation:
    """Everything a search needs from one generation; immutable apart from the mask cache."""

    key: _StatKey | None
    manifest: ShardManifest | None
    retriever: Any = None  # bm25s.BM25 (untyped library); None when the generation cannot match anything
    chunk_ids: npt.NDArray[np.str_] | None = None
    zone_codes: npt.NDArray[np.int32] | None = None
    zone_index: dict[str, int] = field(default_factory=dict)
    zone_sizes: dict[int, int] = field(default_factory=dict)
    masks: _MaskCache | None = None
    positions: _Positions | None = None

    def with_key(self, key: _StatKey | None) -> _Generation:
        return replace(self, key=key)

    def term_stats(self, tokens: list[str], *, zone: str) -> TermStats:
        """How many of ``zone``'s documents this generation holds, and how many contain each token."""
        code = self.zone_index.get(zone)
        if self.retriever is None or self.zone_codes is None or code is None:
            return TermStats()
        vocab: dict[str, int] = self.retriever.vocab_dict
        indptr, indices = self.retriever.scores["indptr"], self.retriever.scores["indices"]
        df: dict[str, int] = {}
        for token in set(tokens):
            token_id = vocab.get(token)
            if token_id is not None:
                docs = indices[indptr[token_id] : indptr[token_id + 1]]
                df[token] = int(np.count_nonzero(self.zone_codes[docs] == code))
        return TermStats(docs=self.zone_sizes[code], df=df)

    def search(
        self,
        tokens: list[str],
        *,
        zone: str,
        k: int,
        allowed: Collection[str] | None = None,
        stats: TermStats | None = None,
    ) -> list[LexicalHit]:
        if self.retriever is None or self.masks is None or self.chunk_ids is None or self.zone_codes is None:
            return []
        code = self.zone_index.get(zone)
        if code is None:
            return []
        weights = self._term_weights(tokens, stats)
        if not weights:
            return []
        # Only the zone's own documents can score above zero under its mask, so asking for more than the
        # zone holds is wasted sorting.
        top = min(k, self.zone_sizes[code])
        mask = self.masks.get(code)
        if allowed is not None and self.positions is not None:
            # A filter narrows the mask itself, before the top-k cut: the zone's best *matching* chunks.
            keep = self.positions.of(allowed)
            narrowed = np.zeros_like(mask)
            narrowed[keep] = mask[keep]
            mask, top = narrowed, min(top, len(keep))
            if top == 0:
                return []
        scores = self._scores(weights) * mask
        best = _top(scores, top)
        hits: list[LexicalHit] = []
        for doc, score in zip(best.tolist(), scores[best].tolist(), strict=True):
            # The mask zeroes every other zone's score, so the zone check never drops a hit; it stays as the
            # guarantee that no query ever sees another zone's chunk.
            if score > 0.0 and int(self.zone_codes[doc]) == code:
                hits.append(LexicalHit(str(self.chunk_ids[doc]), float(score)))
        # Deterministic order among equal scores, so repeated queries fuse identically.
        hits.sort(key=lambda hit: (-hit.score, hit.chunk_id))
        return hits


    def _term_weights(self, tokens: list[str], stats: TermStats | None) -> dict[int, float]:
        """Per known token id, the factor its stored scores are summed with.

        A token repeated in the query counts once per occurrence, as in bm25s. With zone-wide ``stats``, the
        factor also swaps the shard's baked-in IDF for the zone's.
        """
        assert self.retriever is not None
        vocab: dict[str, int] = self.retriever.vocab_dict
        indptr = self.retriever.scores["indptr"]
        shard_docs = int(self.retriever.scores["num_docs"])
        weights: dict[int, float] = {}
        for token, count in Counter(tokens).items():
            token_id = vocab.get(token)
            if token_id is None:
                continue
            weight = float(count)
            if stats is not None and stats.docs > 0:
                shard_df = int(indptr[token_id + 1] - indptr[token_id])
                weight *= stats.idf(token) / lucene_idf(shard_df, shard_docs)
            weights[token_id] = weight
        return weights

    def _scores(self, weights: dict[int, float]) -> npt.NDArray[np.float32]:
        """Every document's BM25 score for the weighted tokens: a sum of sparse columns of the score matrix."""
        assert self.retriever is not None
        matrix = self.retriever.scores
        data, indices, indptr = matrix["data"], matrix["indices"], matrix["indptr"]
        scores = np.zeros(int(matrix["num_docs"]), dtype=np.float32)
        for token_id, weight in weights.items():
            start, end = int(indptr[token_id]), int(indptr[token_id + 1])
            # A column lists each document once, so fancy-index += cannot drop repeated positions.
            scores[indices[start:end]] += np.float32(weight) * data[start:end]
        return scores


def _top(scores: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.int64]:
    """Positions of the ``k`` highest scores (unordered; callers sort the hits)."""
    if k >= len(scores):
        return np.arange(len(scores))
    return np.argpartition(scores, len(scores) - k)[len(scores) - k :]


class LexicalShardReader:
    """Searches the published BM25 index of one shard; thread-safe.

    Loads lazily on the first search (or :meth:`refresh`), mapping the index files with mmap so memory is
    shared with the page cache and between worker processes on one machine.
    """

    def __init__(
        self,
        root: Path,
        shard: int,
        *,
        tokenizer: Tokenizer | None = None,
        mask_cache_bytes: int = _DEFAULT_MASK_CACHE_BYTES,
    ) -> None:
        self._tokenizer = tokenizer or Tokenizer()
        self._root = root
        self._shard = shard
        self._mask_cache_bytes = mask_cache_bytes
        self._manifest_path = manifest_path(root, shard)
        self._lock = threading.Lock()
        self._state: _Generation | None = None

    @property
    def shard(self) -> int:
        """The shard this reader serves."""
        return self._shard

    @property
    def manifest(self) -> ShardManifest | None:
        """The manifest of the loaded generation (None before the first load or when nothing is built)."""
        state = self._state
        return state.manifest if state is not None else None

    @property
    def generation(self) -> int | None:
        """The loaded generation number (None before the first load or when nothing is built)."""
        manifest = self.manifest
        return manifest.generation if manifest is not None else None

    def refresh(self) -> ShardManifest | None:
        """Load the published generation now if it is not loaded yet; return its manifest.

        Searches do this on their own; call it at worker start-up to pay the load before the first query.
        """
        return self._current(wait=True).manifest

    def term_stats(self, query: str, *, zone: str) -> TermStats:
        """This shard's share of the zone-wide statistics for ``query``'s terms (see :mod:`.stats`)."""
        tokens = self._tokenizer(query)
        if not tokens:
            return TermStats()
        return self._current(wait=False).term_stats(tokens, zone=zone)

    def search(
        self,
        query: str,
        *,
        zone: str,
        k: int,
        allowed: Collection[str] | None = None,
        stats: TermStats | None = None,
    ) -> list[LexicalHit]:
        """The best ``k`` chunks of ``zone`` for ``query``, best first, all with a score above zero.

        Zone filtering multiplies the scores by the zone's weight mask before the top-k cut, so a zone gets its own
        ``k`` best chunks however many better matches other zones hold. Unknown terms are ignored; a query
        with no known term returns ``[]``. ``allowed`` (chunk ids), when given, restricts the search to those
        chunks the same way, inside the mask. ``stats`` (the zone's statistics summed over every shard)
        replaces the shard's own IDFs, so scores compare across shards and do not depend on other zones.
        """
        if k < 1:
            raise InvalidQueryError(f"k must be at least 1, got {k}")
        tokens = self._tokenizer(query)
        state = self._current(wait=False)
        if not tokens:
            return []
        return state.search(tokens, zone=zone, k=k, allowed=allowed, stats=stats)

    def _stat_key(self) -> _StatKey | None:
        try:
            st = os.stat(self._manifest_path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailableError(f"cannot stat BM25 manifest {self._manifest_path}: {exc}") from exc
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)

    def _current(self, *, wait: bool) -> _Generation:
        """The generation to search: the loaded one if the manifest has not changed, else the new one."""
        state = self._state
        key = self._stat_key()
        if state is not None and state.key == key:
            return state
        # While another thread loads the new generation, keep serving the one already loaded instead of
        # queueing every search behind the load.
        if not self._lock.acquire(blocking=wait or state is None):
            assert state is not None
            return state
        try:
            state = self._state
            key = self._stat_key()
            if state is not None and state.key == key:
                return state
            fresh = self._load_published(key, previous=state)
            self._state = fresh
            return fresh
        finally:
            self._lock.release()

    def _load_published(self, key: _StatKey | None, *, previous: _Generation | None) -> _Generation:
        for _ in range(_LOAD_ATTEMPTS):
            # The key was taken before this read: if the manifest changes in between, the next search sees a
            # different key and reloads, so no publish is ever missed.
            manifest = read_manifest(self._root, self._shard)
            if manifest is None:
                return _Generation(key=key, manifest=None)
            if (
                previous is not None
                and previous.manifest is not None
                and previous.manifest.generation == manifest.generation
                and previous.manifest.directory == manifest.directory
            ):
                return previous.with_key(key)
            try:
                return self._load_generation(key, manifest)
            except FileNotFoundError:
                key = self._stat_key()
        raise StoreUnavailableError(
            f"shard {self._shard}: BM25 generation directories kept disappearing while loading; "
            "builders are publishing faster than this reader can load"
        )

    def _load_generation(self, key: _StatKey | None, manifest: ShardManifest) -> _Generation:
        if manifest.tokenizer != self._tokenizer.name:
            # Never search with mismatched tokens. The keyword leg of this shard stays empty until the shard
            # is rebuilt with this tokenizer (`shardfuse wait` and the next write both trigger that), rather
            # than failing every query in the meantime.
            logger.warning(
                "shard %d: BM25 generation %d was built with tokenizer %r, this worker uses %r; "
                "its keyword leg is empty until the shard is rebuilt",
                self._shard, manifest.generation, manifest.tokenizer, self._tokenizer.name,
            )
            return _Generation(key=key, manifest=None)
        if manifest.doc_count == 0 or manifest.vocab_size == 0:
            return _Generation(key=key, manifest=manifest)
        directory = shard_dir(self._root, self._shard) / manifest.directory
        try:
            retriever = bm25s.BM25.load(directory, mmap=True, show_progress=False)
            chunk_ids = np.load(directory / CHUNK_IDS_FILE, mmap_mode="r", allow_pickle=False)
            zone_codes = np.load(directory / ZONE_CODES_FILE, allow_pickle=False).astype(np.int32, copy=False)
            zone_names = json.loads((directory / ZONE_NAMES_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read BM25 generation {directory}: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise PermanentError(
                f"BM25 generation {directory} is corrupt ({exc}); rebuild shard {self._shard}'s BM25 index"
            ) from exc
        sizes = (
            manifest.doc_count,
            int(retriever.scores["num_docs"]),
            len(chunk_ids),
            len(zone_codes),
        )
        if len(set(sizes)) != 1 or not isinstance(zone_names, list):
            raise PermanentError(
                f"BM25 generation {directory} is inconsistent (document counts {sizes}); "
                f"rebuild shard {self._shard}'s BM25 index"
            )
        counts = np.bincount(zone_codes, minlength=len(zone_names))
        return _Generation(
            key=key,
            manifest=manifest,
            retriever=retriever,
            chunk_ids=chunk_ids,
            zone_codes=zone_codes,
            zone_index={str(name): code for code, name in enumerate(zone_names)},
            zone_sizes={code: int(count) for code, count in enumerate(counts.tolist())},
            masks=_MaskCache(codes=zone_codes, max_bytes=self._mask_cache_bytes),
            positions=_Positions(chunk_ids),
        )
