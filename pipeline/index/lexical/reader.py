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
from collections.abc import Collection
from pathlib import Path

import bm25s
import numpy as np

from shardfuse.pipeline.core.errors import InvalidQueryError, PermanentError, StoreUnavailableError
from shardfuse.pipeline.index.lexical.delta import DeltaSegment, load_delta
from shardfuse.pipeline.index.lexical.hits import LexicalHit
from shardfuse.pipeline.index.lexical.layout import (
    CHUNK_IDS_FILE,
    ZONE_CODES_FILE,
    ZONE_NAMES_FILE,
    manifest_path,
    shard_dir,
)
from shardfuse.pipeline.index.lexical.manifest import ShardManifest, read_manifest
from shardfuse.pipeline.index.lexical.segments import Generation, MaskCache, Positions, StatKey
from shardfuse.pipeline.index.lexical.stats import TermStats
from shardfuse.pipeline.index.lexical.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# A generation can vanish between reading the manifest and mapping its files when builders publish twice
# in that window and collect it; the manifest has moved on by then, so re-reading it a few times converges.
_LOAD_ATTEMPTS = 3

_DEFAULT_MASK_CACHE_BYTES = 64 * 1024 * 1024


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
        self._state: Generation | None = None

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

    def _stat_key(self) -> StatKey | None:
        try:
            st = os.stat(self._manifest_path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailableError(f"cannot stat BM25 manifest {self._manifest_path}: {exc}") from exc
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)

    def _current(self, *, wait: bool) -> Generation:
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

    def _load_published(self, key: StatKey | None, *, previous: Generation | None) -> Generation:
        for _ in range(_LOAD_ATTEMPTS):
            # The key was taken before this read: if the manifest changes in between, the next search sees a
            # different key and reloads, so no publish is ever missed.
            manifest = read_manifest(self._root, self._shard)
            if manifest is None:
                return Generation(key=key, manifest=None)
            try:
                if previous is not None and previous.manifest is not None and _same_base(previous.manifest, manifest):
                    if _same_delta(previous.manifest, manifest):
                        return previous.with_key(key)
                    # Same generation, new delta: keep the mapped files and caches, load the small delta.
                    return previous.with_delta(key, manifest, self._load_delta(manifest, previous))
                loaded = self._load_generation(key, manifest)
                if manifest.delta and loaded.manifest is not None:
                    loaded = loaded.with_delta(key, manifest, self._load_delta(manifest, loaded))
                return loaded
            except FileNotFoundError:
                key = self._stat_key()
        raise StoreUnavailableError(
            f"shard {self._shard}: BM25 generation directories kept disappearing while loading; "
            "builders are publishing faster than this reader can load"
        )

    def _load_delta(self, manifest: ShardManifest, generation: Generation) -> DeltaSegment | None:
        if not manifest.delta or generation.retriever is None:
            return None
        delta = load_delta(shard_dir(self._root, self._shard) / manifest.delta, base_zone_codes=generation.zone_codes)
        if delta.base != manifest.directory:
            raise PermanentError(
                f"shard {self._shard}: BM25 delta {manifest.delta} belongs to {delta.base}, not "
                f"{manifest.directory}; rebuild shard {self._shard}'s BM25 index"
            )
        return delta

    def _load_generation(self, key: StatKey | None, manifest: ShardManifest) -> Generation:
        if manifest.tokenizer != self._tokenizer.name:
            # Never search with mismatched tokens. The keyword leg of this shard stays empty until the shard
            # is rebuilt with this tokenizer (`shardfuse wait` and the next write both trigger that), rather
            # than failing every query in the meantime.
            logger.warning(
                "shard %d: BM25 generation %d was built with tokenizer %r, this worker uses %r; "
                "its keyword leg is empty until the shard is rebuilt",
                self._shard, manifest.generation, manifest.tokenizer, self._tokenizer.name,
            )
            return Generation(key=key, manifest=None)
        if manifest.doc_count == 0 or manifest.vocab_size == 0:
            return Generation(key=key, manifest=manifest)
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
        # Plain ndarray views of the mapped files (the same pages, no copy): indexing a np.memmap wraps every
        # slice in a new memmap object, ~2 µs each, hundreds of times a query.
        for name in ("data", "indices", "indptr"):
            retriever.scores[name] = retriever.scores[name].view(np.ndarray)
        return Generation(
            key=key,
            manifest=manifest,
            retriever=retriever,
            chunk_ids=chunk_ids.view(np.ndarray),
            zone_codes=zone_codes,
            zone_index={str(name): code for code, name in enumerate(zone_names)},
            zone_sizes={code: int(count) for code, count in enumerate(counts.tolist())},
            masks=MaskCache(codes=zone_codes, max_bytes=self._mask_cache_bytes),
            positions=Positions(chunk_ids),
        )


# A rebuild after a shard's folder was lost numbers generations (and deltas) from 1 again, so a name alone does
# not identify what was built: its build time does too.
def _same_base(a: ShardManifest, b: ShardManifest) -> bool:
    return (a.generation, a.directory, a.created_at) == (b.generation, b.directory, b.created_at)


def _same_delta(a: ShardManifest, b: ShardManifest) -> bool:
    return (a.delta, a.delta_created_at) == (b.delta, b.delta_created_at)
