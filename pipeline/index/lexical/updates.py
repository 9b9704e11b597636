"""Keeping one shard's BM25 index current: a delta segment per update, a merge (full build) now and then.

Which documents to index comes from PostgreSQL, never from Redis: the manifest records the database snapshot
the index was read at, and :meth:`ShardIndexer.update` asks the shard for the documents changed since it
(:mod:`shardfuse.pipeline.index.store.change_log`, one indexed query, returning the snapshot it read at). So
whatever was lost in between — the bookkeeping after a commit (a crash, a Redis error), Redis's own data (a
flush, a failover to a replica that lacked the last writes) — the next update finds every committed
document. Redis only paces updates (:mod:`.freshness`).

:meth:`ShardIndexer.update` runs after commits (debounced): under the shard lock it reads the changed
documents' current chunks, writes a delta over the generation and publishes it by switching the manifest —
the same atomic publish as a generation's. Its cost follows the documents written since the last merge, not
the shard. It falls back to a merge when the generation cannot take a delta (none yet, built before deltas
or before snapshots existed, empty). It reports when a merge is due: the delta holds more than
``delta_max_chunks`` chunks or a quarter of the generation's, or is older than ``merge_after_s``.

:meth:`ShardIndexer.merge` is the full build: the snapshot is taken before the chunks are read; the new
generation is published together with a catch-up delta of the documents changed since that snapshot (built
under the lock, so no concurrent delta is lost).
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

from shardfuse.pipeline.core.durable_files import fsync_dir, fsync_tree
from shardfuse.pipeline.index.lexical.builder import CatchUp, build_shard_index
from shardfuse.pipeline.index.lexical.delta import has_base_stats, write_delta
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.layout import (
    STAGING_PREFIX,
    delta_dir_name,
    parse_delta_dir_name,
    shard_dir,
)
from shardfuse.pipeline.index.lexical.manifest import ShardManifest
from shardfuse.pipeline.index.lexical.publishing import LocalPublishing, ShardPublishing
from shardfuse.pipeline.index.lexical.rows import Rows, document_rows, iter_shard_rows, shard_changes, shard_mark
from shardfuse.pipeline.index.lexical.tokenizer import Tokenizer
from shardfuse.pipeline.index.store.change_log import ChangeSet

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
    # What changed since a snapshot, and the snapshot of now (the shard's documents table; tests pass theirs).
    changes_since: Callable[[Any, str], ChangeSet] = shard_changes
    mark_now: Callable[[Any], ChangeSet] = shard_mark
    # Where the index is published (None: into ``root`` itself, :class:`LocalPublishing`).
    publishing: ShardPublishing | None = None

    def __post_init__(self) -> None:
        if self.publishing is None:
            self.publishing = LocalPublishing(self.root, self.shard)

    @property
    def _publishing(self) -> ShardPublishing:
        assert self.publishing is not None
        return self.publishing

    def update(self) -> dict[str, Any]:
        """Make the index current with a delta (or a merge when a delta cannot); see the module docstring."""
        started = time.monotonic()
        self.freshness.begin_rebuild(self.shard)  # frees the flag: later writes schedule again
        directory = shard_dir(self.root, self.shard)
        directory.mkdir(parents=True, exist_ok=True)
        with self._publishing.lock():
            current = self._publishing.current()
            reason = self._no_delta(current)
            if reason is None:
                assert current is not None
                # On top of the published delta, only documents changed since it are read again.
                changes = self.changes_since(self.store, current.built_snapshot)
                if changes.version < current.built_version:
                    # Transaction ids count from the start again in another cluster (a restore into a new
                    # one): its writes would all look older than the index.
                    reason = "PostgreSQL's transaction ids went backwards (a restored or replaced database)"
                elif not changes.keys:
                    return self._result("current", current, started)
                else:
                    manifest = self._publish_delta(directory, current, changes)
                    return self._result("delta", manifest, started, merge_due=self._merge_due(manifest))
        logger.info("shard %d: BM25 merge instead of a delta: %s", self.shard, reason)
        return self.merge()

    def merge(self) -> dict[str, Any]:
        """A full build from a snapshot taken before the chunks are read (so nothing after it is lost)."""
        started = time.monotonic()
        mark = self.mark_now(self.store)
        rows = Rows.of(self.all_rows(self.store))
        directory = shard_dir(self.root, self.shard)

        def catch_up(generation_dir: Path) -> CatchUp:
            changes = self.changes_since(self.store, mark.mark)
            if not changes.keys:
                return CatchUp("", changes.version, 0, 0, changes.mark)
            fresh = self.doc_rows(self.store, changes.keys)
            name, docs, masked = stage_delta(directory, generation_dir, fresh, changes.keys,
                                             tokenizer=self.tokenizer, k1=self.k1, b=self.b)
            return CatchUp(name, changes.version, docs, masked, changes.mark)

        with self._publishing.lock():
            published = self._publishing.current()
        # Transaction ids went backwards (another cluster): the published versions say nothing any more.
        restored = published is not None and published.tracks_postgres and mark.version < published.built_version
        manifest = build_shard_index(
            self.root, self.shard, chunk_ids=rows.chunk_ids, zones=rows.zones, texts=rows.texts,
            paths=rows.paths, built_version=mark.version, built_snapshot=mark.mark, k1=self.k1, b=self.b,
            keep_generations=self.keep_generations, tokenizer=self.tokenizer, catch_up=catch_up,
            replace_any=restored, publishing=self._publishing,
        )
        self.freshness.record_build(self.shard, seconds=time.monotonic() - started)
        return self._result("merge", manifest, started)

    def _no_delta(self, current: ShardManifest | None) -> str | None:
        """Why the published generation cannot take a delta (None: it can)."""
        if current is None:
            return "nothing published yet"
        if not current.tracks_postgres:
            return "the index predates versions from PostgreSQL"
        if current.tokenizer != self.tokenizer.name:
            return f"built with tokenizer {current.tokenizer!r}"
        if current.vocab_size == 0 or current.doc_count == 0:
            return "the generation is empty"
        if (current.k1, current.b) != (self.k1, self.b):
            return "k1 or b changed"
        if not has_base_stats(shard_dir(self.root, self.shard) / current.directory):
            return "the generation predates delta segments"
        return None

    def _publish_delta(self, directory: Path, current: ShardManifest, changes: ChangeSet) -> ShardManifest:
        rows = self.doc_rows(self.store, changes.keys)
        previous = directory / current.delta if current.delta else None
        name, docs, masked = stage_delta(directory, directory / current.directory, rows, changes.keys,
                                         tokenizer=self.tokenizer, k1=self.k1, b=self.b, previous=previous)
        manifest = replace(current, built_version=max(current.built_version, changes.version),
                           built_snapshot=changes.mark, base_version=current.generation_version, delta=name,
                           delta_docs=docs, delta_masked=masked, delta_created_at=time.time())
        self._publishing.publish(manifest)
        self._publishing.collected(keep_generations=self.keep_generations, manifest=manifest)
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
