"""A shard's chunks as the BM25 builders take them: every chunk (a full build) or those of a few documents
(a delta), read by :class:`~shardfuse.pipeline.index.store.ShardStore` with each chunk's document path, which a
generation needs to let a delta mask a rewritten document's rows; and which documents changed since a
snapshot (:mod:`shardfuse.pipeline.index.store.change_log`), which is what a delta reads."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from shardfuse.pipeline.index.store.change_log import ChangeSet


class LexicalRow(NamedTuple):
    chunk_id: str
    zone: str
    path: str
    text: str


class Rows(NamedTuple):
    """Column-wise rows, as the builders take them."""

    chunk_ids: list[str]
    zones: list[str]
    paths: list[str]
    texts: list[str]

    @classmethod
    def of(cls, rows: Iterable[tuple[str, str, str, str]]) -> Rows:
        out = cls([], [], [], [])
        for chunk_id, zone, path, text in rows:
            out.chunk_ids.append(chunk_id)
            out.zones.append(zone)
            out.paths.append(path)
            out.texts.append(text)
        return out


def iter_shard_rows(store: Any, *, batch_size: int = 5000) -> Iterator[LexicalRow]:
    """Every chunk of ``store``'s shard, from one snapshot (``ShardStore.iter_lexical_rows``)."""
    return map(LexicalRow._make, store.iter_lexical_rows(batch_size=batch_size))


def document_rows(store: Any, keys: Iterable[tuple[str, str]]) -> Rows:
    """The current chunks of the documents ``keys`` (``(zone, path)``; absent ones have none)."""
    return Rows.of(store.lexical_rows_for(keys))


def shard_mark(store: Any) -> ChangeSet:
    """The shard's snapshot of this moment (``ShardStore.change_mark``): what a full build reads from."""
    mark: ChangeSet = store.change_mark()
    return mark


def shard_changes(store: Any, mark: str) -> ChangeSet:
    """The documents changed since snapshot ``mark`` (``ShardStore.changes_since``)."""
    changes: ChangeSet = store.changes_since(mark)
    return changes
