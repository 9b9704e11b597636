"""Settled paths → the changes to publish: what is on disk now (walked as ``shardfuse publish`` walks it:
same ``.gitignore`` rules, same document names) against what the :class:`Ledger` says the index holds."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shardfuse.pipeline.admin.reconcile import tree_prefix
from shardfuse.pipeline.admin.sources import SpecCache, document_name, iter_files_below, walk_skips
from shardfuse.pipeline.admin.watching.events import Touched
from shardfuse.pipeline.admin.watching.ledger import Ledger
from shardfuse.pipeline.core.events import Op
from shardfuse.pipeline.storage.streams import file_hash


@dataclass(frozen=True, slots=True)
class Change:
    op: Op
    name: str  # the document path
    file: Path | None = None  # a write's file: hashed when it was resolved, streamed into the CAS when published
    content_hash: str | None = None  # the hash when resolved (the event names what was stored)


@dataclass
class Resolution:
    changes: list[Change] = field(default_factory=list)  # writes then deletes, each in name order
    unreadable: dict[str, str] = field(default_factory=dict)  # name -> why its file could not be read (left alone)


def distinct_roots(paths: Iterable[Path]) -> tuple[Path, ...]:
    """The directories to watch, resolved, without those inside another (watched already)."""
    resolved = sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in resolved:
        if not any(path == root or root in path.parents for root in kept):
            kept.append(path)
    return tuple(sorted(kept))


class SourceTrees:
    """The watched directories (distinct, resolved) and the directory document names are relative to."""

    def __init__(self, roots: Sequence[Path], *, base: Path | None = None) -> None:
        self.roots = distinct_roots(roots)
        self.base = (base or Path.cwd()).resolve()

    def root_of(self, path: Path) -> Path | None:
        return next((root for root in self.roots if path == root or root in path.parents), None)

    def resolve(self, items: Sequence[Touched], ledger: Ledger) -> Resolution:
        """The changes that make the index hold what is on disk at the ``items``' paths now."""
        writes: dict[str, Change] = {}
        present: set[str] = set()  # names found on disk (published or not): never deleted
        looked_under: list[str] = []  # directory prefixes whose live documents must each be on disk
        missing: set[str] = set()
        out = Resolution()
        cache: SpecCache = {}  # each .gitignore read once per look
        for touched in items:
            item = Touched(Path(os.path.normpath(touched.path)), touched.is_directory)  # no "..": names as publish's
            root = self.root_of(item.path)
            if root is None:
                continue
            name = document_name(item.path, base=self.base)
            if item.path.is_dir() and not walk_skips(item.path, root=root, base=self.base, cache=cache):
                for source in iter_files_below(item.path, root=root, base=self.base, cache=cache):
                    self._consider(source.path, source.name, ledger, writes, present, out)
                looked_under.append(tree_prefix(name))
                missing.add(name)  # a file that became a directory
            elif item.path.is_file() and not walk_skips(item.path, root=root, base=self.base, cache=cache):
                missing.add(name)  # if it vanishes before it is read
                self._consider(item.path, name, ledger, writes, present, out)
            else:  # gone, ignored now, or never a file the walk yields
                missing.add(name)
                if item.is_directory or item.path.is_dir():
                    looked_under.append(tree_prefix(name))
        for prefix in looked_under:
            missing.update(ledger.names_under(prefix))
        deletes = sorted(n for n in missing if n not in present and ledger.hash_of(n) is not None)
        out.changes = [*(writes[n] for n in sorted(writes)), *(Change(Op.DELETE, n) for n in deletes)]
        return out

    @staticmethod
    def _consider(path: Path, name: str, ledger: Ledger, writes: dict[str, Change], present: set[str],
                  out: Resolution) -> None:
        if name in present:
            return
        present.add(name)
        try:
            content_hash = file_hash(path)  # in chunks: a file of any size costs a few MiB
        except FileNotFoundError:  # gone since it was listed: a delete, if the index holds it
            present.discard(name)
            return
        except OSError as exc:  # unreadable: what the index holds is left alone
            out.unreadable[name] = exc.strerror or str(exc)
            return
        if ledger.hash_of(name) != content_hash:
            writes[name] = Change(Op.WRITE, name, path, content_hash)
