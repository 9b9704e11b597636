"""Anti-entropy: make what a zone's index holds under a source tree equal to the tree, by publishing exactly
the difference (``shardfuse reconcile DIR --zone Z``).

Events are the only way a change reaches the index, so an event lost in flight (Redis lost its queues, or a
shard was restored to an earlier point) leaves the index behind, and nothing later notices: every later event
is about another path, or repeats the loss. Reconciling walks the tree exactly as ``shardfuse publish`` does
(:mod:`shardfuse.pipeline.admin.sources`: same ``.gitignore`` rules, same document names, relative to the
working directory), reads what every shard holds for the zone under the tree's name (path, content hash, seq,
status, tombstones included) and compares:

- a file the index lacks, holds as deleted, or holds with another content hash → a write;
- a document the index holds (indexed or skipped, not a tombstone) whose file is gone → a delete;
- everything else is left alone (and so is every document outside the tree, and every file that could not be
  read or named: not knowing its content is no reason to delete it).

Each event's ``seq`` exceeds the one the shard holds for its path (the publisher's clock, ``time.time_ns()``,
or the stored seq + 1 if that clock is behind it), so the version rule cannot ignore it as stale. Running it
again with nothing in flight publishes nothing; with events still in flight it may repeat one, which the
version rule makes harmless.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from psycopg import sql

from shardfuse.pipeline.admin.publisher import Publisher, Write, why_not_published
from shardfuse.pipeline.admin.sources import iter_source_files
from shardfuse.pipeline.core.errors import InvalidEventError, SchemaMissingError
from shardfuse.pipeline.core.events import MAX_BIGINT, Op, WriteEvent
from shardfuse.pipeline.index.store.changes import DocStatus
from shardfuse.pipeline.index.store.connections import pooled_connection
from shardfuse.pipeline.index.store.schema import shard_schema
from shardfuse.pipeline.index.store.shard_store import ShardStore
from shardfuse.pipeline.storage.streams import file_hash


class Stage(enum.StrEnum):
    WALK = "walk"  # files read and hashed
    COMPARE = "compare"  # documents of the index read
    PUBLISH = "publish"  # events published


Progress = Callable[[Stage, int], None]  # (stage, items done so far in it)


@dataclass(frozen=True, slots=True)
class IndexedDocument:
    """What a shard holds for one path of the zone."""

    path: str
    content_hash: str | None
    seq: int
    status: str  # DocStatus: "indexed", "skipped" or "deleted" (a tombstone)


@dataclass(frozen=True, slots=True)
class Planned:
    """One event to publish: ``after_seq`` is the seq the index holds for the path (-1: none), which the
    event's seq must exceed."""

    path: str
    after_seq: int


@dataclass(frozen=True, slots=True)
class ReconcilePlan:
    writes: tuple[Planned, ...]
    deletes: tuple[Planned, ...]
    unchanged: int  # files the index holds at their content hash
    tombstones: int  # documents deleted in the index and absent from the tree: nothing to do
    compared: int  # documents of the index under the tree (tombstones included)
    stuck: tuple[str, ...] = ()  # paths whose stored seq is the largest there is: no event can supersede it


def tree_prefix(name: str) -> str:
    """The document-path prefix of a tree published under ``name`` ("" for the working directory)."""
    return "" if name in (".", "") else name.rstrip("/") + "/"


def in_scope(path: str, prefix: str) -> bool:
    """Whether a document path lies under the tree of ``prefix``. The working directory's tree (prefix "")
    holds every relative name; absolute names were published from outside it."""
    return path.startswith(prefix) if prefix else not path.startswith("/")


def next_seq(after_seq: int, now: int) -> int:
    """The seq of an event that must win over ``after_seq``: the clock, unless the clock is behind it."""
    return max(now, after_seq + 1)


def plan(tree: Mapping[str, str], indexed: Iterable[IndexedDocument], *, prefix: str,
         leave: Collection[str] = ()) -> ReconcilePlan:
    """The difference between ``tree`` (document path → content hash) and the ``indexed`` documents (those
    outside ``prefix`` are ignored), leaving the paths in ``leave`` alone (files that could not be read)."""
    held: dict[str, IndexedDocument] = {}
    for doc in indexed:
        if in_scope(doc.path, prefix) and doc.path not in leave:
            known = held.get(doc.path)
            if known is None or doc.seq > known.seq:  # a path is on one shard: this is only a safeguard
                held[doc.path] = doc
    writes = [Planned(path, -1) for path in tree if path not in held and path not in leave]
    deletes: list[Planned] = []
    unchanged = tombstones = 0
    for path, doc in held.items():
        content_hash = tree.get(path)
        if content_hash is None:
            if doc.status == DocStatus.DELETED:
                tombstones += 1
            else:
                deletes.append(Planned(path, doc.seq))
        elif doc.status == DocStatus.DELETED or doc.content_hash != content_hash:
            writes.append(Planned(path, doc.seq))
        else:
            unchanged += 1
    stuck = tuple(sorted(p.path for p in (*writes, *deletes) if p.after_seq >= MAX_BIGINT))
    return ReconcilePlan(
        writes=tuple(sorted((p for p in writes if p.path not in stuck), key=lambda p: p.path)),
        deletes=tuple(sorted((p for p in deletes if p.path not in stuck), key=lambda p: p.path)),
        unchanged=unchanged, tombstones=tombstones, compared=len(held), stuck=stuck,
    )


# -- the source tree ----------------------------------------------------------------------------------------
@dataclass
class SourceTree:
    prefix: str
    hashes: dict[str, str] = field(default_factory=dict)  # document path -> content hash
    files: dict[str, Path] = field(default_factory=dict)  # document path -> file on disk
    unreadable: dict[str, str] = field(default_factory=dict)  # document path -> why it is left alone


def scan_tree(root: Path, *, zone: str, base: Path | None = None, progress: Progress | None = None) -> SourceTree:
    """Walk ``root`` as ``shardfuse publish`` does and hash every file (CAS names). A file that cannot be
    read, or whose name no event can carry, is recorded in ``unreadable`` and will be left alone."""
    base = (base or Path.cwd()).resolve()
    resolved = root.resolve()
    if not resolved.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    WriteEvent(op=Op.DELETE, zone=zone, path="-", seq=0)  # an invalid zone is refused before any work
    tree = SourceTree(prefix=tree_prefix(_root_name(resolved, base)))
    for walked, source in enumerate(iter_source_files([resolved], base=base), start=1):
        try:
            WriteEvent(op=Op.DELETE, zone=zone, path=source.name, seq=0)
            tree.hashes[source.name] = file_hash(source.path)  # in chunks: a few MiB whatever its size
            tree.files[source.name] = source.path
        except InvalidEventError as exc:
            tree.unreadable[source.name] = str(exc)
        except OSError as exc:
            tree.unreadable[source.name] = exc.strerror or str(exc)
        if progress is not None:
            progress(Stage.WALK, walked)
    return tree


def _root_name(root: Path, base: Path) -> str:
    """The document name of the directory ``root``, as :func:`iter_source_files` names what is under it."""
    try:
        return root.relative_to(base).as_posix()
    except ValueError:
        return root.as_posix()


# -- what the shards hold -----------------------------------------------------------------------------------
def indexed_documents(stores: Sequence[ShardStore], zone: str, *, prefix: str) -> Iterator[IndexedDocument]:
    """Every document row of ``zone`` under ``prefix`` in every shard, streamed (a server-side cursor per
    shard). A shard no worker has created yet holds nothing."""
    query = sql.SQL("SELECT path, content_hash, seq, status FROM {s}.documents "
                    "WHERE zone = %s AND starts_with(path, %s) AND seq >= 0")
    for store in stores:
        try:
            with (pooled_connection(store.pool, what=f"shard {store.shard}") as conn, conn.transaction(),
                  conn.cursor(name=f"reconcile_shard_{store.shard}") as cur):
                cur.itersize = 5000
                cur.execute(query.format(s=sql.Identifier(shard_schema(store.shard))), (zone, prefix))
                for path, content_hash, seq, status in cur:
                    yield IndexedDocument(path, content_hash, int(seq), str(status))
        except SchemaMissingError:
            continue


# -- the whole run ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReconcileReport:
    tree: SourceTree
    plan: ReconcilePlan
    events: tuple[WriteEvent, ...] = ()  # what was published (none on a dry run)
    not_published: Mapping[str, str] = field(default_factory=dict)  # planned writes whose file vanished since

    @property
    def walked(self) -> int:
        return len(self.tree.hashes) + len(self.tree.unreadable)


IndexReader = Callable[[str], Iterable[IndexedDocument]]  # prefix -> the zone's documents under it


def reconcile(root: Path, *, zone: str, index: IndexReader, publisher: Publisher | None, base: Path | None = None,
              clock: Callable[[], int] = time.time_ns, progress: Progress | None = None) -> ReconcileReport:
    """Compare the tree ``root`` with what ``index`` holds for ``zone`` and publish the difference through
    ``publisher`` (None: a dry run, which publishes nothing)."""
    tree = scan_tree(root, zone=zone, base=base, progress=progress)
    diff = plan(tree.hashes, _counted(index(tree.prefix), progress), prefix=tree.prefix, leave=tree.unreadable)
    if publisher is None:
        return ReconcileReport(tree, diff)
    events, vanished = publish_plan(diff, tree, zone=zone, publisher=publisher, clock=clock, progress=progress)
    return ReconcileReport(tree, diff, tuple(events), vanished)


def _counted(documents: Iterable[IndexedDocument], progress: Progress | None) -> Iterator[IndexedDocument]:
    for compared, doc in enumerate(documents, start=1):
        if progress is not None:
            progress(Stage.COMPARE, compared)
        yield doc


def publish_plan(diff: ReconcilePlan, tree: SourceTree, *, zone: str, publisher: Publisher,
                 clock: Callable[[], int] = time.time_ns,
                 progress: Progress | None = None) -> tuple[list[WriteEvent], dict[str, str]]:
    """Publish ``diff``'s writes (each file streamed into the CAS as it is now, CAS first) and deletes, each with
    a seq above the stored one. Returns the events, and the planned writes that could not be published (a file
    gone or unreadable since the walk, or changed while it was stored), each with the reason."""
    vanished: dict[str, str] = {}
    published = 0

    def writes() -> Iterator[Write]:
        nonlocal published
        for item in diff.writes:
            yield Write(zone=zone, path=item.path, data=tree.files[item.path], seq=next_seq(item.after_seq, clock()))
            published += 1
            if progress is not None:
                progress(Stage.PUBLISH, published)

    def gone(write: Write, exc: Exception) -> None:
        vanished[write.path] = why_not_published(exc)

    events = publisher.write_many(writes(), not_published=gone)
    for item in diff.deletes:
        events.append(publisher.delete(zone=zone, path=item.path, seq=next_seq(item.after_seq, clock())))
        published += 1
        if progress is not None:
            progress(Stage.PUBLISH, published)
    return events, vanished
