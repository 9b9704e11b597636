"""Keeping one shard's BM25 index current: a delta segment per update, a merge (full build) now and then.

:meth:`ShardIndexer.update` runs after commits (debounced): under the shard lock it reads the dirty
version and the documents written since the published generation (atomically, from Redis), reads their
current chunks, writes a delta over the generation and publishes it by switching the manifest — the same
atomic publish as a generation's. Its cost follows the documents written since the last merge, not the
shard. It falls back to a merge when the generation cannot take a delta (none yet, built before deltas
existed, empty) or a write could not name its documents. It reports when a merge is due: the delta holds
more than ``delta_max_chunks`` chunks or a quarter of the generation's, or is older than
``merge_after_s``.

:meth:`ShardIndexer.merge` is the full build: the dirty version is read before the snapshot; the new
generation is published together with a catch-up delta of the writes that landed during the build (built
under the lock, so no concurrent delta is lost), then Redis forgets the documents the generation holds.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shardfuse.pipeline.core.durable_files import exclusive_lock, fsync_dir, fsync_tree
from shardfuse.pipeline.core.errors import PermanentError
from shardfuse.pipeline.index.lexical.builder import CatchUp, build_shard_index, collect_garbage
from shardfuse.pipeline.index.lexical.delta import has_base_stats, write_delta
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.layout import (
    LOCK_NAME,
    STAGING_PREFIX,
    delta_dir_name,
    parse_delta_dir_name,
    shard_dir,
)
from shardfuse.pipeline.index.lexical.manifest import ShardManifest, read_manifest, write_manifest
from shardfuse.pipeline.index.lexical.rows import Rows, document_rows, iter_shard_rows
from shardfuse.pipeline.index.lexical.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# A delta larger than this share of its generation is merged (its documents' average length drifts).
MAX_DELTA_SHARE = 0.25


def stage_delta(directory: Path, base_dir: Path, rows: Rows, touched: Iterable[tuple[str, str]], *,
                tokenizer: Tokenizer, k1: float, b: float, previous: Path | None = None) -> tuple[str, int, int]:
    """Write a delta over ``base_dir`` and install it as the next ``delta_<n>`` (fsynced, not yet
    published); return its name, its rows and the base rows it masks. Call under the shard lock."""
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=directory))
    try:
        staging.chmod(0o755)
        docs, masked = write_delta(staging, base_dir=base_dir, rows=rows, touched=touched,
                                   tokenizer=tokenizer, k1=k1, b=b, previous=previous)
        fsync_tree(staging)
        numbers = [parse_delta_dir_name(entry.name) for entry in directory.iterdir()]
        name = delta_dir_name(max([n for n in numbers if n is not None], default=0) + 1)
        os.rename(staging, directory / name)
        fsync_dir(directory)
        return name, docs, masked
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@dataclass
class ShardIndexer:
    """Builds and publishes one shard's BM25 index: deltas and merges."""

    root: Path
    shard: int
    store: Any  # shardfuse.pipeline.index.store.ShardStore
    freshness: Bm25Freshness
    tokenizer: Tokenizer
    k1: float = 1.5
    b: float = 0.75
    keep_generations: int = 2
    delta_max_chunks: int = 20_000
    merge_after_s: float = 3600.0
    # Where rows come from (the shard's tables; tests pass their own).
    all_rows: Callable[[Any], Iterable[tuple[str, str, str, str]]] = iter_shard_rows
    doc_rows: Callable[[Any, Iterable[tuple[str, str]]], Rows] = document_rows

    def update(self) -> dict[str, Any]:
        """Make the index current with a delta (or a merge when a delta cannot); see the module docstring."""
        started = time.monotonic()
        version = self.freshness.begin_rebuild(self.shard)  # frees the flag: later writes schedule again
        directory = shard_dir(self.root, self.shard)
        directory.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(directory / LOCK_NAME):
            current = self._published()
            reason = self._no_delta(current)
            if reason is None:
                assert current is not None
                touched = self.freshness.touched(self.shard, since=current.generation_version)
                if touched.untracked:
                    reason = "a write did not name its documents"
                elif current.built_version >= touched.version:
                    return self._result("current", current, started)
                else:
                    # On top of the published delta, only documents written since it are read again.
                    fresh = touched.since(current.built_version) if current.delta else touched.keys
                    manifest = self._publish_delta(directory, current, touched.version, fresh)
                    return self._result("delta", manifest, started, merge_due=self._merge_due(manifest))
        logger.info("shard %d: BM25 merge instead of a delta: %s", self.shard, reason)
        return self.merge(version=version)

    def merge(self, *, version: int | None = None) -> dict[str, Any]:
        """A full build (``version``: the dirty version read before the snapshot; read now when None)."""
        started = time.monotonic()
        if version is None:
            version = self.freshness.dirty_version(self.shard)
        rows = Rows.of(self.all_rows(self.store))
        directory = shard_dir(self.root, self.shard)

        def catch_up(generation_dir: Path) -> CatchUp | None:
            touched = self.freshness.touched(self.shard, since=version)
            if touched.untracked:
                return None
            if not touched.keys:
                return CatchUp("", touched.version, 0, 0)
            fresh = self.doc_rows(self.store, touched.keys)
            name, docs, masked = stage_delta(directory, generation_dir, fresh, touched.keys,
                                             tokenizer=self.tokenizer, k1=self.k1, b=self.b)
            return CatchUp(name, touched.version, docs, masked)

        manifest = build_shard_index(
            self.root, self.shard, chunk_ids=rows.chunk_ids, zones=rows.zones, texts=rows.texts,
            paths=rows.paths, built_version=version, k1=self.k1, b=self.b,
            keep_generations=self.keep_generations, tokenizer=self.tokenizer, catch_up=catch_up,
        )
        if manifest.generation_version == version:
            self.freshness.trim(self.shard, upto=version)
        self.freshness.record_build(self.shard, seconds=time.monotonic() - started)
        return self._result("merge", manifest, started)

    def _published(self) -> ShardManifest | None:
        try:
            return read_manifest(self.root, self.shard)
        except PermanentError as exc:
            logger.warning("shard %d: %s", self.shard, exc)
            return None

    def _no_delta(self, current: ShardManifest | None) -> str | None:
        """Why the published generation cannot take a delta (None: it can)."""
        if current is None:
            return "nothing published yet"
        if current.tokenizer != self.tokenizer.name:
            return f"built with tokenizer {current.tokenizer!r}"
        if current.vocab_size == 0 or current.doc_count == 0:
            return "the generation is empty"
        if (current.k1, current.b) != (self.k1, self.b):
            return "k1 or b changed"
        if not has_base_stats(shard_dir(self.root, self.shard) / current.directory):
            return "the generation predates delta segments"
        return None

    def _publish_delta(self, directory: Path, current: ShardManifest, version: int,
                       keys: list[tuple[str, str]]) -> ShardManifest:
        rows = self.doc_rows(self.store, keys)
        previous = directory / current.delta if current.delta else None
        name, docs, masked = stage_delta(directory, directory / current.directory, rows, keys,
                                         tokenizer=self.tokenizer, k1=self.k1, b=self.b, previous=previous)
        manifest = replace(current, built_version=version, base_version=current.generation_version, delta=name,
                           delta_docs=docs, delta_masked=masked, delta_created_at=time.time())
        write_manifest(self.root, manifest)
        collect_garbage(directory, keep_generations=self.keep_generations, published=current.generation,
                        delta=name)
        return manifest

    def _merge_due(self, manifest: ShardManifest) -> bool:
        return (
            manifest.delta_docs > self.delta_max_chunks
            or manifest.delta_docs > MAX_DELTA_SHARE * manifest.doc_count
            or time.time() - manifest.created_at > self.merge_after_s
        )

    def _result(self, kind: str, manifest: ShardManifest, started: float, *,
                merge_due: bool = False) -> dict[str, Any]:
        return {"shard": self.shard, "kind": kind, "generation": manifest.generation, "delta": manifest.delta,
                "documents": manifest.doc_count, "delta_documents": manifest.delta_docs,
                "built_version": manifest.built_version, "merge_due": merge_due,
                "seconds": round(time.monotonic() - started, 4)}
