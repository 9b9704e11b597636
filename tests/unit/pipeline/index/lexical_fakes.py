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


class MemoryShard:
    """``(zone, path)`` → chunk texts; a write replaces a document's chunks (new ids, as seq changes)."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._seq = 0

    def write(self, zone: str, path: str, *texts: str) -> None:
        self._seq += 1
        self.docs[(zone, path)] = [(f"{path}#{self._seq}.{i}", t) for i, t in enumerate(texts)]

    def delete(self, zone: str, path: str) -> None:
        self.docs.pop((zone, path), None)

    def all_rows(self, _store: Any) -> Iterator[tuple[str, str, str, str]]:
        rows = [(cid, z, p, t) for (z, p), chunks in self.docs.items() for cid, t in chunks]
        yield from sorted(rows)

    def doc_rows(self, _store: Any, keys: Iterable[tuple[str, str]]) -> Rows:
        wanted = set(keys)
        return Rows.of(sorted((cid, z, p, t) for (z, p), chunks in self.docs.items() if (z, p) in wanted
                              for cid, t in chunks))


def indexer(root: Path, shard: MemoryShard, freshness: Bm25Freshness | None = None, **options: Any) -> ShardIndexer:
    return ShardIndexer(root=root, shard=0, store=None, freshness=freshness or Bm25Freshness(fakeredis.FakeRedis()),
                        tokenizer=Tokenizer(), all_rows=shard.all_rows, doc_rows=shard.doc_rows, **options)
