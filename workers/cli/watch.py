"""``shardfuse watch DIR… --zone Z``: catch up with what changed while nothing watched (``reconcile``), then
publish each change as it happens (``pipeline/admin/watching/``) until Ctrl-C, which publishes what is still
pending before it stops."""

from __future__ import annotations

import argparse
import contextlib
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.admin.reconcile import IndexedDocument, ReconcileReport, indexed_documents
from shardfuse.pipeline.admin.watching.catch_up import catch_up, root_names
from shardfuse.pipeline.admin.watching.events import FsEvent
from shardfuse.pipeline.admin.watching.follow import Totals, follow
from shardfuse.pipeline.admin.watching.fs_observer import observing
from shardfuse.pipeline.admin.watching.resolution import SourceTrees
from shardfuse.pipeline.admin.watching.watcher import Watcher
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.store import ShardPools
from shardfuse.pipeline.storage.opening import open_content_store
from shardfuse.workers.cli import arguments
from shardfuse.workers.publishing import CeleryEventSink


def register(sub: Any) -> None:
    p = sub.add_parser("watch", help="publish a directory's changes as they happen (debounced, honouring "
                                     ".gitignore); catches up with what changed while it was not running")
    p.add_argument("directories", nargs="+", type=Path, metavar="DIR",
                   help="directories to follow; documents are named as `publish` names them")
    p.add_argument("--zone", required=True, type=arguments.zone, help="the zone (tenant) to index into")
    p.set_defaults(handler=run_watch)


def say(line: str) -> None:
    print(line, flush=True)


def warn(line: str) -> None:
    print(f"shardfuse watch: {line}", file=sys.stderr, flush=True)


def run_watch(args: argparse.Namespace, settings: Settings) -> int:
    for directory in args.directories:
        if not directory.is_dir():
            warn(f"{directory} is not a directory")
            return 2
    WriteEvent(op=Op.DELETE, zone=args.zone, path="-", seq=0)  # an invalid zone is refused before any work
    trees = SourceTrees(args.directories)
    inbox: queue.Queue[FsEvent] = queue.Queue()
    totals: Totals | None = None
    left_alone = 0
    try:
        # The observer runs first: what changes while catching up is queued, and looked at after it.
        with observing(trees.roots, inbox) as alive, CeleryEventSink.connect(settings) as sink:
            publisher = Publisher(cas=open_content_store(settings), sink=sink)
            say(f"catching up: {', '.join(root_names(trees))} against zone {args.zone!r}")
            with ShardPools(settings, min_size=1, max_size=2) as pools:
                ledger, reports = catch_up(trees, zone=args.zone, index=partial(_index, pools, args.zone),
                                           publisher=publisher)
            sink.flush()
            left_alone = sum(_said_caught_up(report) for report in reports)
            watcher = Watcher(zone=args.zone, trees=trees, ledger=ledger, publisher=publisher, flush=sink.flush,
                              settle_s=settings.watch.settle_ms / 1000, max_delay_s=settings.watch.max_delay_ms / 1000)
            say(f"watching {', '.join(root_names(trees))} for zone {args.zone!r} (Ctrl-C to stop)")
            stop = threading.Event()
            with _stopped_by_signals(stop):
                totals = follow(watcher, inbox, stop=stop, retry_max_s=settings.watch.retry_max_s, say=say,
                                warn=warn, alive=alive)
            if not stop.is_set():
                warn("the file system observer stopped (a watched directory was removed?)")
    except StoreUnavailableError as exc:
        if totals is None:
            raise
        totals.unpublished_at_stop = totals.unpublished_at_stop or 1
        warn(str(exc))
    return _said_stopped(totals, left_alone) if totals is not None else 2


def _index(pools: ShardPools, zone: str, prefix: str) -> Iterator[IndexedDocument]:
    return indexed_documents(pools.stores(), zone, prefix=prefix)


def _said_caught_up(report: ReconcileReport) -> int:
    """Print one tree's catch-up; returns how many paths it left alone."""
    diff = report.plan
    written = len(diff.writes) - len(report.not_published)
    say(f"caught up {report.tree.prefix or './'}: {written} written, {len(diff.deletes)} deleted, "
        f"{diff.unchanged} unchanged")
    alone = {**report.tree.unreadable, **report.not_published,
             **{path: "its stored seq cannot be exceeded" for path in diff.stuck}}
    for path, reason in alone.items():
        warn(f"not published: {path}: {reason}")
    return len(alone)


def _said_stopped(totals: Totals, left_alone: int) -> int:
    say(f"stopped: published {totals.writes} write(s), {totals.deletes} delete(s) in all")
    if totals.unpublished_at_stop:
        warn(f"{totals.unpublished_at_stop} change(s) could not be published before stopping; the next "
             "`shardfuse watch` (or `shardfuse reconcile`) of the same directories publishes them")
        return 1
    return 1 if totals.not_published or left_alone else 0


@contextlib.contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM ask the loop to publish what is pending and stop; a second one interrupts."""

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
