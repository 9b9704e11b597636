"""``shardfuse publish`` and ``shardfuse delete``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from shardfuse.pipeline.admin.publisher import Publisher, Write, why_not_published
from shardfuse.pipeline.admin.sources import iter_source_files
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.storage.opening import open_content_store
from shardfuse.workers.cli import arguments
from shardfuse.workers.publishing import CeleryEventSink


def register(sub: Any) -> None:
    publish = sub.add_parser("publish", help="publish files and directories (recursively, honouring .gitignore)")
    publish.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    publish.add_argument("--zone", required=True, type=arguments.zone, help="the zone (tenant) to index into")
    publish.set_defaults(handler=run_publish)

    delete = sub.add_parser("delete", help="publish deletes for document paths (files and directories)")
    delete.add_argument("paths", nargs="+", metavar="PATH",
                        help="document paths as published; a local directory deletes the files under it")
    delete.add_argument("--zone", required=True, type=arguments.zone)
    delete.set_defaults(handler=run_delete)


def run_publish(args: argparse.Namespace, settings: Settings) -> int:
    files = list(iter_source_files(args.paths))
    failed: list[str] = []

    def not_published(write: Write, exc: Exception) -> None:
        failed.append(f"{write.path}: {why_not_published(exc)}")

    with CeleryEventSink.connect(settings) as sink:
        publisher = Publisher(cas=open_content_store(settings), sink=sink)
        # Each file streamed into the CAS (a few MiB whatever its size), several at once: a store's writes
        # wait on its disk or network, so overlapping them is what makes a large tree publish quickly.
        events = publisher.write_many(
            (Write(zone=args.zone, path=source.name, data=source.path)
             for source in tqdm(files, desc=f"publishing to zone {args.zone}", unit="file",
                                disable=not sys.stderr.isatty() and not files)),
            not_published=not_published)
    total = sum(event.size for event in events)
    print(f"published {len(events)} file(s), {total:,} bytes, to zone {args.zone!r}")
    for line in failed:
        print(f"  not published: {line}", file=sys.stderr)
    return 1 if failed else 0


def run_delete(args: argparse.Namespace, settings: Settings) -> int:
    names: list[str] = []
    for raw in args.paths:
        local = Path(raw)
        # An existing local file or directory names what it holds; anything else is a document path.
        if local.exists():
            names.extend(f.name for f in iter_source_files([local]))
        else:
            names.append(raw)
    with CeleryEventSink.connect(settings) as sink:
        publisher = Publisher(cas=open_content_store(settings), sink=sink)
        for name in tqdm(names, desc=f"deleting from zone {args.zone}", unit="file"):
            publisher.delete(zone=args.zone, path=name)
    print(f"published {len(names)} delete(s) to zone {args.zone!r}")
    return 0
