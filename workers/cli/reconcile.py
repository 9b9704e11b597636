"""``shardfuse reconcile DIR --zone Z [--dry-run] [--json]``: publish exactly what differs between a source
tree and what the zone's index holds under it (``pipeline/admin/reconcile.py``): the repair after a lost Redis
or a restore."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.admin.reconcile import (
    IndexedDocument,
    Progress,
    ReconcileReport,
    Stage,
    indexed_documents,
    reconcile,
)
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.index.store import ShardPools
from shardfuse.pipeline.storage.opening import open_content_store
from shardfuse.workers.cli import arguments
from shardfuse.workers.publishing import CeleryEventSink

_BARS = {Stage.WALK: ("files walked", "file"), Stage.COMPARE: ("documents compared", "doc"),
         Stage.PUBLISH: ("events published", "event")}


def register(sub: Any) -> None:
    p = sub.add_parser("reconcile", help="publish exactly what differs between a directory and a zone's index "
                                         "(after a lost Redis or a restore)")
    p.add_argument("directory", type=Path, metavar="DIR", help="the source tree, named as `publish` names it")
    p.add_argument("--zone", required=True, type=arguments.zone)
    p.add_argument("--dry-run", action="store_true", help="report the difference; publish nothing")
    p.add_argument("--json", action="store_true", help="one JSON object, with every event")
    p.set_defaults(handler=run_reconcile)


@contextlib.contextmanager
def _progress_bars() -> Iterator[Progress]:
    bars: dict[Stage, Any] = {}

    def update(stage: Stage, done: int) -> None:
        if stage not in bars:
            desc, unit = _BARS[stage]
            bars[stage] = tqdm(desc=desc, unit=unit, file=sys.stderr, disable=None)
        bar = bars[stage]
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        for bar in bars.values():
            bar.close()


def run_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    if not args.directory.is_dir():
        print(f"shardfuse reconcile: {args.directory} is not a directory", file=sys.stderr)
        return 2
    messages = 0
    with ShardPools(settings, min_size=1, max_size=2) as pools, _progress_bars() as progress:
        index = partial(_index, pools, args.zone)
        if args.dry_run:
            report = reconcile(args.directory, zone=args.zone, index=index, publisher=None, progress=progress)
        else:
            with CeleryEventSink.connect(settings) as sink:
                publisher = Publisher(cas=open_content_store(settings), sink=sink)
                report = reconcile(args.directory, zone=args.zone, index=index, publisher=publisher,
                                   progress=progress)
            messages = sink.messages
    if args.json:
        print(json.dumps(_as_json(report, args, messages)))
    else:
        _print_report(report, args, messages)
    return 1 if report.tree.unreadable or report.not_published or report.plan.stuck else 0


def _index(pools: ShardPools, zone: str, prefix: str) -> Iterator[IndexedDocument]:
    return indexed_documents(pools.stores(), zone, prefix=prefix)


def _as_json(report: ReconcileReport, args: argparse.Namespace, messages: int) -> dict[str, Any]:
    diff = report.plan
    return {
        "zone": args.zone, "directory": str(args.directory), "dry_run": args.dry_run,
        "walked": report.walked, "compared": diff.compared, "unchanged": diff.unchanged,
        "tombstones": diff.tombstones,
        "write": [p.path for p in diff.writes], "delete": [p.path for p in diff.deletes],
        "events": [{"op": e.op.value, "path": e.path, "seq": e.seq, "content_hash": e.content_hash}
                   for e in report.events],
        "messages": messages,
        "not_published": {**report.tree.unreadable, **report.not_published,
                          **{p: "its stored seq cannot be exceeded" for p in diff.stuck}},
    }


def _print_report(report: ReconcileReport, args: argparse.Namespace, messages: int) -> None:
    diff = report.plan
    scope = f"zone {args.zone!r} under {report.tree.prefix or './'}"
    counts = f"{report.walked} file(s) walked, {diff.compared} document(s) compared"
    if args.dry_run:
        for item in diff.writes:
            print(f"write   {item.path}")
        for item in diff.deletes:
            print(f"delete  {item.path}")
        print(f"dry run, {scope}: would write {len(diff.writes)}, delete {len(diff.deletes)}; "
              f"{diff.unchanged} unchanged ({counts})")
    else:
        written = len(diff.writes) - len(report.not_published)
        print(f"reconciled {scope}: {written} written, {len(diff.deletes)} deleted, {diff.unchanged} unchanged "
              f"({counts}; {len(report.events)} event(s) in {messages} message(s))")
    for path, reason in {**report.tree.unreadable, **report.not_published}.items():
        print(f"  left alone: {path}: {reason}", file=sys.stderr)
    for path in diff.stuck:
        print(f"  left alone: {path}: its stored seq is the largest a seq can be", file=sys.stderr)
