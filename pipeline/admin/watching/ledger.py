"""What the index holds (or will, once the events in flight apply) for the watched trees: each live
document's content hash, and the highest seq seen for every path, tombstones included."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shardfuse.pipeline.admin.reconcile import IndexedDocument, in_scope, next_seq
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.store.changes import DocStatus


@dataclass
class Ledger:
    live: dict[str, str] = field(default_factory=dict)  # document path -> content hash (not tombstones)
    floors: dict[str, int] = field(default_factory=dict)  # document path -> the highest seq known for it

    def hash_of(self, name: str) -> str | None:
        return self.live.get(name)

    def names_under(self, prefix: str) -> list[str]:
        """Live documents under the tree of ``prefix`` (:func:`~shardfuse.pipeline.admin.reconcile.tree_prefix`)."""
        return [name for name in self.live if in_scope(name, prefix)]

    def seq_for(self, name: str, now: int) -> int:
        """The seq of the next event of ``name``: the clock, unless something already holds a later one."""
        return next_seq(self.floors.get(name, -1), now)

    def held(self, documents: Iterable[IndexedDocument]) -> None:
        """Record what the shards hold (read by ``reconcile``)."""
        for doc in documents:
            self._floor(doc.path, doc.seq)
            if doc.status == DocStatus.DELETED or doc.content_hash is None:
                self.live.pop(doc.path, None)
            else:
                self.live[doc.path] = doc.content_hash

    def published(self, event: WriteEvent) -> None:
        """Record an event sent to the index."""
        self._floor(event.path, event.seq)
        if event.op is Op.DELETE or event.content_hash is None:
            self.live.pop(event.path, None)
        else:
            self.live[event.path] = event.content_hash

    def _floor(self, name: str, seq: int) -> None:
        if seq > self.floors.get(name, -1):
            self.floors[name] = seq
