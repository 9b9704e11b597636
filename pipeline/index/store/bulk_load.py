"""Bulk-load mode, chosen per shard before each write: defer the shard's HNSW index when the load coming
its way is large next to the shard (the cost model is
:class:`~shardfuse.pipeline.index.store.vector_index.DeferPolicy`).

The load coming at a shard is this write plus its share of what waits in the queues: ``backlog()``
documents in all (the workers count queued messages), at this write's rows per document, spread evenly
over the shards. The database is asked about a shard (deferred already? how many rows?) at most every
``refresh_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardfuse.pipeline.index.store import ShardStore
from shardfuse.pipeline.index.store.vector_index import DeferPolicy

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _ShardView:
    deferred: bool
    rows: int
    checked_at: float


class BulkLoadGate:
    def __init__(
        self,
        stores: Sequence[ShardStore],
        *,
        policy: DeferPolicy,
        backlog: Callable[[], int],
        refresh_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stores = stores
        self._policy = policy
        self._backlog = backlog
        self._refresh_s = refresh_s
        self._clock = clock
        self._views: dict[int, _ShardView] = {}
        self._lock = threading.Lock()

    def before_write(self, shard: int, *, rows: int, documents: int) -> None:
        """Called before ``rows`` rows of ``documents`` documents are written to ``shard``."""
        if self._policy.min_rows <= 0 or rows <= 0:
            return
        view = self._view(shard)
        if view.deferred:
            return
        pending = max(0, self._backlog()) * rows / max(1, documents) / max(1, len(self._stores))
        incoming = rows + int(pending)
        if not self._policy.should_defer(shard_rows=view.rows, incoming_rows=incoming):
            return
        log.info("shard %d: about %d rows coming at a shard of about %d: writing them without the HNSW index",
                 shard, incoming, view.rows)
        if self._stores[shard].defer_vector_index():
            with self._lock:
                view.deferred = True

    def deferred(self, shard: int) -> bool:
        """Whether ``shard``'s index is deferred (as of at most ``refresh_s`` ago)."""
        return self._view(shard).deferred

    def _view(self, shard: int) -> _ShardView:
        now = self._clock()
        with self._lock:
            view = self._views.get(shard)
            if view is not None and now - view.checked_at < self._refresh_s:
                return view
        store = self._stores[shard]
        fresh = _ShardView(deferred=store.vector_index_deferred(), rows=store.row_estimate(), checked_at=now)
        with self._lock:
            self._views[shard] = fresh
        return fresh
