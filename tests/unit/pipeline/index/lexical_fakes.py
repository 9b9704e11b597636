"""An in-memory shard for BM25 delta tests: documents of chunks, read as the shard's tables would be."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import fakeredis

from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.rows import Rows
from shardfuse.pipeline.index.lexical.tokenizer import Tokenizer
from shardfuse.pipeline.index.lexical.updates import ShardIndexer
from shardfuse.pipeline.index.store.change_log import ChangeSet


class MemoryShard:
    """``(zone, path)`` → chunk texts; a write replaces a document's chunks (new ids, as seq changes). Like
    the shard's ``documents.change_xid``, every write and delete records when it happened (a counter), and
    a snapshot ("mark") is that counter's value as text."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.changed: dict[tuple[str, str], int] = {}
        self._seq = 0

    def write(self, zone: str, path: str, *texts: str) -> None:
        self._seq += 1
        self.docs[(zone, path)] = [(f"{path}#{self._seq}.{i}", t) for i, t in enumerate(texts)]
        self.changed[(zone, path)] = self._seq

    def delete(self, zone: str, path: str) -> None:
        self._seq += 1
        self.docs.pop((zone, path), None)
        self.changed[(zone, path)] = self._seq

    def touch(self, zone: str, path: str) -> None:
        """A write of the same content (new chunk ids, as a re-index gives)."""
        self._seq += 1
        self.docs[(zone, path)] = [(f"{path}#{self._seq}.{i}", t) for i, (_, t) in enumerate(self.docs[(zone, path)])]
        self.changed[(zone, path)] = self._seq

    def mark_now(self, _store: Any) -> ChangeSet:
        return ChangeSet(str(self._seq), self._seq, [])

    def changes_since(self, _store: Any, mark: str) -> ChangeSet:
        since = int(mark)
        return ChangeSet(str(self._seq), self._seq, sorted(k for k, at in self.changed.items() if at > since))

    def all_rows(self, _store: Any) -> Iterator[tuple[str, str, str, str]]:
        rows = [(cid, z, p, t) for (z, p), chunks in self.docs.items() for cid, t in chunks]
        yield from sorted(rows)

    def doc_rows(self, _store: Any, keys: Iterable[tuple[str, str]]) -> Rows:
        wanted = set(keys)
        return Rows.of(sorted((cid, z, p, t) for (z, p), chunks in self.docs.items() if (z, p) in wanted
                              for cid, t in chunks))


def indexer(root: Path, shard: MemoryShard, freshness: Bm25Freshness | None = None, **options: Any) -> ShardIndexer:
    return ShardIndexer(root=root, shard=0, store=None, freshness=freshness or Bm25Freshness(fakeredis.FakeRedis()),
                        tokenizer=Tokenizer(), all_rows=shard.all_rows, doc_rows=shard.doc_rows,
                        changes_since=shard.changes_since, mark_now=shard.mark_now, **options)
