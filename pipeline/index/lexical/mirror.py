"""A shard's BM25 index published to storage every node shares, and this node's local copy of it.

No two machines share a filesystem. Builders still build generations and deltas in a local directory
(:attr:`ShardMirror.root`), and :class:`ShardMirror` publishes them to a :class:`PublishedIndex` (the shard's
PostgreSQL schema, :mod:`shardfuse.pipeline.index.store.lexical_publication`): the directories are uploaded,
then the manifest is switched in one statement. Every node's local directory is a cache: :meth:`ShardMirror.follow`
fetches the directories the published manifest names that the node lacks (each carries the id of its upload,
so a stale copy under the same name is fetched again), then installs the manifest locally, where the
:class:`~shardfuse.pipeline.index.lexical.reader.LexicalShardReader` picks it up as before. A builder on a node
that starts empty fetches what it builds on the same way (:meth:`ShardMirror.current`).

The local manifest never goes back: a builder installs it after the shared switch, holding the local lock,
and a follower installs one only under that lock and only if it is still the published one.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from enum import Enum
from pathlib import Path
from typing import Protocol

from shardfuse.pipeline.core.durable_files import exclusive_lock, fsync_dir, fsync_tree, try_exclusive_lock
from shardfuse.pipeline.core.errors import PermanentError, StoreUnavailableError
from shardfuse.pipeline.index.lexical.garbage import collect_garbage
from shardfuse.pipeline.index.lexical.layout import (
    LOCK_NAME,
    STAGING_PREFIX,
    parse_delta_dir_name,
    parse_generation_dir_name,
    shard_dir,
)
from shardfuse.pipeline.index.lexical.manifest import ShardManifest, read_manifest_text, write_manifest

logger = logging.getLogger(__name__)

# The file in a local directory naming the upload it is a copy of.
UPLOAD_STAMP = ".upload"
# A follower re-reads the manifest this many times when the segments it named were collected meanwhile.
_FOLLOW_ATTEMPTS = 3
# Deltas kept in shared storage besides the published one (a follower mid-switch may still fetch it).
_KEEP_DELTAS = 2


class Unread(Enum):
    """:meth:`ShardMirror.follow` reads the published manifest itself."""

    UNREAD = "unread"


class SegmentGone(LookupError):
    """A segment the manifest named is no longer stored (collected after a newer publish)."""


class PublishedIndex(Protocol):
    """One shard's BM25 index in storage every node shares (the port; PostgreSQL is the adapter)."""

    shard: int

    def lock(self) -> AbstractContextManager[None]: ...

    def manifest(self) -> ShardManifest | None: ...

    def upload_of(self, segment: str) -> str | None: ...

    def upload(self, segment: str, directory: Path) -> str: ...

    def fetch(self, segment: str, target: Path) -> str:
        """Write the segment's files into ``target``; its upload id. Raises :class:`LookupError` when gone."""
        ...

    def switch(self, manifest: ShardManifest) -> None: ...

    def segments(self) -> list[str]:
        """Every stored segment's name, the most recently uploaded first."""
        ...

    def delete(self, names: list[str]) -> None: ...


class ShardMirror:
    """Publishes one shard's index to a :class:`PublishedIndex` and keeps the local copy in step with it.

    For builders it is a :class:`~shardfuse.pipeline.index.lexical.publishing.ShardPublishing`; query nodes call
    :meth:`follow`.
    """

    def __init__(self, root: Path, published: PublishedIndex, *, keep_generations: int = 2) -> None:
        self.root = root
        self.keep_generations = keep_generations
        self.shard = published.shard
        self._published = published
        self._directory = shard_dir(root, published.shard)
        self._installed: tuple[str, ShardManifest] | None = None  # the local manifest file's text, parsed

    # -- builders (ShardPublishing) ------------------------------------------------------------------------
    @contextmanager
    def lock(self) -> Iterator[None]:
        """Every node's builders of the shard (the shared lock), and this node's followers (the local one)."""
        self._directory.mkdir(parents=True, exist_ok=True)
        with self._published.lock(), exclusive_lock(self._directory / LOCK_NAME):
            yield

    def current(self) -> ShardManifest | None:
        """The published manifest, fetched and installed locally. Call under :meth:`lock`."""
        manifest = self._published_manifest()
        if manifest is not None:
            self._materialise(manifest)
            self._install(manifest)
        return manifest

    def publish(self, manifest: ShardManifest) -> None:
        """Upload the manifest's directories this node built, switch the shared manifest, then the local one.
        Call under :meth:`lock`."""
        for segment in (manifest.directory, manifest.delta):
            if segment:
                self._ensure_uploaded(segment)
        self._published.switch(manifest)
        write_manifest(self.root, manifest)

    def collected(self, *, keep_generations: int, manifest: ShardManifest) -> None:
        """Drop old generations and deltas, locally and in shared storage. Call under :meth:`lock`."""
        collect_garbage(self._directory, keep_generations=keep_generations, published=manifest.generation,
                        delta=manifest.delta)
        stored = self._published.segments()
        keep = {manifest.directory, manifest.delta}
        keep.update([s for s in stored if parse_generation_dir_name(s) is not None][:keep_generations])
        keep.update([s for s in stored if parse_delta_dir_name(s) is not None][:_KEEP_DELTAS])
        self._published.delete([s for s in stored if s not in keep])

    # -- query nodes -----------------------------------------------------------------------------------------
    def follow(self, published: ShardManifest | None | Unread = Unread.UNREAD) -> ShardManifest | None:
        """Make the local copy the published index: fetch the directories it lacks, install the manifest.

        ``published``: the published manifest, when the caller read it already (with other shards', in one
        statement); it is read again only if its segments are gone. Returns the manifest now installed (None:
        nothing is published). A builder of this node holding the local lock publishes locally itself, so the
        install is skipped rather than waited for.
        """
        for _ in range(_FOLLOW_ATTEMPTS):
            manifest = self._published_manifest() if published is Unread.UNREAD else published
            published = Unread.UNREAD
            if manifest is None:
                return None
            if _same(self.installed(), manifest):
                return manifest  # the common round: nothing new (one small query)
            try:
                self._materialise(manifest)
            except SegmentGone:
                continue  # published over meanwhile: read the manifest again
            self._directory.mkdir(parents=True, exist_ok=True)
            with try_exclusive_lock(self._directory / LOCK_NAME) as locked:
                if locked and _same(self._published_manifest(), manifest):
                    self._install(manifest)
                    collect_garbage(self._directory, keep_generations=self.keep_generations,
                                    published=manifest.generation, delta=manifest.delta)
            return manifest
        raise StoreUnavailableError(f"shard {self.shard}: the published BM25 index changed faster than this node "
                                    "could fetch it; it will try again")

    def installed(self) -> ShardManifest | None:
        """The manifest installed locally (what this node's readers serve); its file is parsed again only
        when its text changed."""
        try:
            self._installed = read_manifest_text(self.root, self.shard, last=self._installed)
        except PermanentError:
            self._installed = None
        return None if self._installed is None else self._installed[1]

    # -- the local copy --------------------------------------------------------------------------------------
    def _published_manifest(self) -> ShardManifest | None:
        try:
            return self._published.manifest()
        except PermanentError as exc:
            logger.warning("shard %d: %s", self.shard, exc)
            return None

    def _install(self, manifest: ShardManifest) -> None:
        if not _same(self.installed(), manifest):
            write_manifest(self.root, manifest)

    def _materialise(self, manifest: ShardManifest) -> None:
        for segment in (manifest.directory, manifest.delta):
            if segment:
                self._ensure_local(segment)

    def _ensure_local(self, segment: str) -> None:
        """Fetch ``segment`` unless the local directory is a copy of the published upload."""
        upload = self._published.upload_of(segment)
        if upload is None:
            raise SegmentGone(segment)
        target = self._directory / segment
        if _stamp(target) == upload:
            return
        self._directory.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self._directory))
        try:
            staging.chmod(0o755)
            try:
                fetched = self._published.fetch(segment, staging)
            except LookupError as exc:
                raise SegmentGone(segment) from exc
            (staging / UPLOAD_STAMP).write_text(fetched, encoding="utf-8")
            fsync_tree(staging)
            self._replace(target, staging, fetched)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        logger.info("shard %d: fetched BM25 %s (upload %s)", self.shard, segment, upload)

    def _replace(self, target: Path, staging: Path, upload: str) -> None:
        """Put ``staging`` at ``target``; a stale copy there is moved aside first (readers mapping its files
        keep them). Another process of this node may have put the same upload there first."""
        if target.exists():
            if _stamp(target) == upload:
                return
            aside = self._directory / f"{STAGING_PREFIX}old-{uuid.uuid4().hex}"
            with suppress(FileNotFoundError):
                os.rename(target, aside)
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(staging, target)
        except OSError:
            if _stamp(target) != upload:
                raise
        fsync_dir(self._directory)

    def _ensure_uploaded(self, segment: str) -> None:
        directory = self._directory / segment
        stamp = _stamp(directory)
        if stamp is not None and self._published.upload_of(segment) == stamp:
            return
        upload = self._published.upload(segment, directory)
        (directory / UPLOAD_STAMP).write_text(upload, encoding="utf-8")


def _stamp(directory: Path) -> str | None:
    try:
        return (directory / UPLOAD_STAMP).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _same(a: ShardManifest | None, b: ShardManifest | None) -> bool:
    return a is not None and b is not None and a.identity == b.identity
