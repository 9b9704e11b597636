"""How a builder publishes a shard's BM25 index: the lock it holds, the manifest it builds on, the switch.

Builders (:mod:`.builder`, :mod:`.updates`) build generations and deltas in a local directory and hand the
result to a :class:`ShardPublishing`. :class:`LocalPublishing` publishes into that directory itself (one
machine, and the unit tests); :class:`~shardfuse.pipeline.index.lexical.mirror.ShardMirror` publishes to
storage every node shares (PostgreSQL), the local directory then being this node's cache.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

from shardfuse.pipeline.core.durable_files import exclusive_lock
from shardfuse.pipeline.core.errors import PermanentError
from shardfuse.pipeline.index.lexical.garbage import collect_garbage
from shardfuse.pipeline.index.lexical.layout import LOCK_NAME, shard_dir
from shardfuse.pipeline.index.lexical.manifest import ShardManifest, read_manifest, write_manifest

logger = logging.getLogger(__name__)


class ShardPublishing(Protocol):
    """Where one shard's builders publish. :meth:`current` and :meth:`publish` are called under :meth:`lock`."""

    root: Path
    shard: int

    def lock(self) -> AbstractContextManager[None]:
        """Serialise every builder of the shard (on every node sharing the publication)."""
        ...

    def current(self) -> ShardManifest | None:
        """The published manifest, its directories present under :attr:`root` (None: nothing published, or
        a damaged manifest a rebuild must replace)."""
        ...

    def publish(self, manifest: ShardManifest) -> None:
        """Make ``manifest`` (whose directories are under :attr:`root`) the published one, atomically."""
        ...

    def collected(self, *, keep_generations: int, manifest: ShardManifest) -> None:
        """After a publish: forget what neither ``manifest`` nor a reader switching to it still needs."""
        ...


class LocalPublishing:
    """Publishing into the local directory: ``MANIFEST.json`` replaced atomically under a ``flock``."""

    def __init__(self, root: Path, shard: int) -> None:
        self.root = root
        self.shard = shard

    @contextmanager
    def lock(self) -> Iterator[None]:
        directory = shard_dir(self.root, self.shard)
        directory.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(directory / LOCK_NAME):
            yield

    def current(self) -> ShardManifest | None:
        try:
            return read_manifest(self.root, self.shard)
        except PermanentError as exc:
            logger.warning("shard %d: replacing a corrupt BM25 manifest: %s", self.shard, exc)
            return None

    def publish(self, manifest: ShardManifest) -> None:
        write_manifest(self.root, manifest)

    def collected(self, *, keep_generations: int, manifest: ShardManifest) -> None:
        collect_garbage(shard_dir(self.root, self.shard), keep_generations=keep_generations,
                        published=manifest.generation, delta=manifest.delta)
