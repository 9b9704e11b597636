"""``shardfuse unreadable [--limit N] [--json] [--drop]``: the items no worker could run, set aside by the
broker transport (:mod:`shardfuse.workers.broker.inbox`) with their reasons."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.redis_errors import redis_errors
from shardfuse.workers import monitor
from shardfuse.workers.broker.inbox import UNREADABLE_KEY, recent_unreadable, unreadable_count
from shardfuse.workers.cli import arguments


def register(sub: Any) -> None:
    p = sub.add_parser("unreadable", help="items on the queues no worker could run, with the reason of each")
    p.add_argument("--limit", type=arguments.positive_int, default=20, help="show this many, newest first")
    p.add_argument("--json", action="store_true")
    p.add_argument("--drop", action="store_true", help="delete them all for good (after reading them)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    client = monitor.broker_client(settings)
    with redis_errors(client, "the broker"):
        total = unreadable_count(client)
        rows = recent_unreadable(client, limit=max(args.limit, 0))
        if args.json:
            print(json.dumps({"count": total, "newest": rows}))
        else:
            for row in rows:
                at = "?" if row["at"] is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["at"]))
                print(f"{at}  [{row['queue']}] {row['size']} bytes: {row['reason']}")
            print(f"{total} item(s) set aside in Redis list {UNREADABLE_KEY} (each record holds the item's "
                  "exact bytes, base64, under 'message')")
        if args.drop:
            client.delete(UNREADABLE_KEY)
            if not args.json:
                print(f"dropped {total}")
    return 0
