"""A query node keeping its local copy of every shard's BM25 index in step with the published one.

:meth:`IndexFollower.sync` runs once before the node answers a query (a node that starts empty fetches every
shard first, so its first answer is complete); :meth:`IndexFollower.start` then follows in a background thread,
every ``interval_s``, so searches never wait for a fetch: they keep the generation they have until the new one
is installed (:class:`~shardfuse.pipeline.index.lexical.reader.LexicalShardReader` swaps it in).

A round reads the published manifests through ``readers`` when given, one call per database
(:class:`~shardfuse.pipeline.index.store.manifest_poll.PublishedManifests`: one statement for all its shards);
a shard no reader answered for reads its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardfuse.pipeline.core.errors import ShardfuseError
from shardfuse.pipeline.index.lexical.manifest import ShardManifest
from shardfuse.pipeline.index.lexical.mirror import ShardMirror, Unread

logger = logging.getLogger(__name__)

# After a failed round, wait this long at most before the next (doubling from the interval).
_MAX_BACKOFF_S = 10.0


@dataclass
class ShardFollowState:
    """What one shard's follower last did."""

    synced: bool = False  # fetched and installed the published index at least once
    installed: str = ""  # the installed generation and delta, "" when nothing is published
    error: str = ""  # the last round's failure, "" when it succeeded
    at: float = 0.0  # when the last round ended (time.time())


class IndexFollower:
    """Follows the published BM25 index of every shard this node serves."""

    def __init__(self, mirrors: Sequence[ShardMirror], *, interval_s: float,
                 readers: Sequence[Callable[[], Mapping[int, ShardManifest | None]]] = ()) -> None:
        self._mirrors = list(mirrors)
        self._readers = list(readers)
        self._interval_s = interval_s
        self._states = {m.shard: ShardFollowState() for m in self._mirrors}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync(self) -> None:
        """One round over every shard, raising the first failure (a :class:`ShardfuseError`)."""
        failure = self._round()
        if failure is not None:
            raise failure

    @property
    def ready(self) -> bool:
        """Whether every shard's published index has been fetched once."""
        return all(state.synced for state in self._states.values())

    def status(self) -> dict[str, Any]:
        """Readiness and each shard's installed index, for ``shardfuse ping`` and the logs."""
        return {"ready": self.ready,
                "shards": {shard: {"synced": s.synced, "installed": s.installed, "error": s.error}
                           for shard, s in sorted(self._states.items())}}

    def start(self) -> None:
        """Follow in a daemon thread until :meth:`stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bm25-follower", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        delay = self._interval_s
        while not self._stop.wait(delay):
            failed = self._round() is not None
            delay = min(_MAX_BACKOFF_S, max(delay * 2, self._interval_s)) if failed else self._interval_s

    def _round(self) -> ShardfuseError | None:
        """Every shard followed once; the first failure, if any."""
        published: dict[int, ShardManifest | None] = {}
        for read in self._readers:
            try:
                published.update(read())
            except ShardfuseError as exc:  # those shards read their own, and report their own failures
                logger.debug("reading published BM25 manifests together failed: %s", exc)
        failure: ShardfuseError | None = None
        for mirror in self._mirrors:
            failure = self._follow(mirror, published.get(mirror.shard, Unread.UNREAD)) or failure
        return failure

    def _follow(self, mirror: ShardMirror, published: ShardManifest | None | Unread) -> ShardfuseError | None:
        state = self._states[mirror.shard]
        try:
            manifest = mirror.follow(published)
        except ShardfuseError as exc:
            if state.error != str(exc):
                logger.warning("shard %d: cannot follow the published BM25 index: %s", mirror.shard, exc)
            state.error, state.at = str(exc), time.time()
            return exc
        state.synced, state.error, state.at = True, "", time.time()
        state.installed = f"{manifest.directory}+{manifest.delta or '-'}" if manifest is not None else ""
        return None
