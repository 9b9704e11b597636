"""``shardfuse deadletters list|show ID|retry [ID ...|--all]|purge``: failed work a person can act on."""

from __future__ import annotations

import argparse
import json
from typing import Any

from shardfuse.pipeline.admin.dead_letters import (
    get_dead_letter,
    list_dead_letters,
    purge_dead_letters,
    take_dead_letters,
)
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.index.store import ShardPools
from shardfuse.pipeline.index.store.connections import pooled_connection
from shardfuse.pipeline.index.store.schema import ensure_shared_schema
from shardfuse.workers.app import create_app
from shardfuse.workers.cli import arguments


def register(sub: Any) -> None:
    p = sub.add_parser("deadletters", help="list, show, retry or purge failed work")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="newest first: id, task, zone/path, error, reason, attempts")
    listing.add_argument("--zone")
    listing.add_argument("--limit", type=arguments.positive_int, default=50)
    listing.add_argument("--json", action="store_true")
    show = actions.add_parser("show", help="one dead letter with its payload")
    show.add_argument("id", type=int)
    retry = actions.add_parser("retry", help="send dead letters back to their task (and remove them)")
    retry.add_argument("ids", type=int, nargs="*", metavar="ID")
    retry.add_argument("--all", action="store_true", help="every dead letter")
    purge = actions.add_parser("purge", help="delete dead letters for good")
    purge.add_argument("--zone", help="only this zone's")
    purge.add_argument("--yes", action="store_true", help="required: purging cannot be undone")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    with ShardPools(settings, min_size=1, max_size=1) as pools:
        pool = pools.shared
        with pooled_connection(pool, what="the dead-letter store") as conn:
            ensure_shared_schema(conn)
        if args.action == "list":
            rows = list_dead_letters(pool, zone=args.zone, limit=args.limit)
            if args.json:
                print(json.dumps(rows, default=str))
            for row in [] if args.json else rows:
                where = f"[{row['zone']}] {row['path']}" if row["path"] else row["task"]
                print(f"#{row['id']:<6} {where}: {row['reason']} ({row['error_class'].rsplit('.', 1)[-1]}, "
                      f"{row['attempts']} attempt(s), last {row['last_failed']:%Y-%m-%d %H:%M:%S})")
            if not rows and not args.json:
                print("no dead letters")
            return 0
        if args.action == "show":
            letter = get_dead_letter(pool, args.id)
            if letter is None:
                print(f"no dead letter #{args.id}")
                return 1
            print(json.dumps(letter, default=str, indent=2))
            return 0
        if args.action == "retry":
            if bool(args.ids) == bool(args.all):
                raise ConfigurationError("give dead-letter ids or --all (not both)")
            app = create_app(settings)
            retried = take_dead_letters(pool, None if args.all else list(args.ids),
                                        lambda task, payload: app.send_task(task, kwargs=payload))
            missing = sorted(set(args.ids) - set(retried))
            # An id missing here was never there, or another retry running at the same time sent it.
            print(f"retried {len(retried)} dead letter(s)" + (f"; not found (or retried elsewhere): {missing}"
                                                              if missing else ""))
            return 1 if missing else 0
        if not args.yes:
            raise ConfigurationError("purge deletes dead letters for good: add --yes")
        print(f"purged {purge_dead_letters(pool, zone=args.zone)} dead letter(s)")
        return 0
