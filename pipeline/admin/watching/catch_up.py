"""On start, catch up with what changed while nothing was watching: ``reconcile`` each watched tree (the
index itself is the record of what was published, so there is no state file of ours to lose or to drift),
and fill the :class:`Ledger` from what the index held plus what reconciling published."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.admin.reconcile import IndexedDocument, IndexReader, Progress, ReconcileReport, reconcile
from shardfuse.pipeline.admin.watching.ledger import Ledger
from shardfuse.pipeline.admin.watching.resolution import SourceTrees


def catch_up(trees: SourceTrees, *, zone: str, index: IndexReader, publisher: Publisher,
             clock: Callable[[], int] = time.time_ns,
             progress: Progress | None = None) -> tuple[Ledger, list[ReconcileReport]]:
    """Reconcile every tree of ``trees`` with what ``index`` holds for ``zone``, publishing the difference.
    Returns the ledger the watcher starts from, and each tree's report."""
    ledger = Ledger()

    def recorded(prefix: str) -> Iterator[IndexedDocument]:
        return _recording(index(prefix), ledger)

    reports = [reconcile(root, zone=zone, index=recorded, publisher=publisher, base=trees.base, clock=clock,
                         progress=progress) for root in trees.roots]
    for report in reports:
        for event in report.events:
            ledger.published(event)
    return ledger, reports


def _recording(documents: Iterable[IndexedDocument], ledger: Ledger) -> Iterator[IndexedDocument]:
    for doc in documents:
        ledger.held([doc])
        yield doc


def root_names(trees: SourceTrees) -> list[str]:
    """How each watched directory is named in document paths (for messages)."""
    out = []
    for root in trees.roots:
        try:
            out.append(root.relative_to(trees.base).as_posix() or ".")
        except ValueError:
            out.append(root.as_posix())
    return out
