"""``shardfuse rebuild-bm25``: rebuild shards' BM25 indexes from PostgreSQL (after a restore, or to re-base
deltas now), as full merges on the maintenance queue."""

from __future__ import annotations

import argparse
from typing import Any

import redis

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.workers.app import create_app
from shardfuse.workers.names import Task


def register(sub: Any) -> None:
    p = sub.add_parser("rebuild-bm25", help="rebuild shards' BM25 indexes from PostgreSQL (a full merge each)")
    p.add_argument("--shard", type=int, action="append", metavar="N",
                   help="only this shard (repeatable; default: every shard)")
    p.set_defaults(handler=run_rebuild)


def run_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    shards = args.shard if args.shard else list(range(settings.shards))
    wrong = [s for s in shards if not 0 <= s < settings.shards]
    if wrong:
        raise ConfigurationError(f"no shard {wrong[0]}: shards are 0..{settings.shards - 1}")
    freshness = Bm25Freshness(redis.Redis.from_url(settings.broker.url))
    app = create_app(settings)
    for shard in shards:
        # One merge per shard at a time: the flag is the one the maintenance worker's own merges take.
        if not freshness.claim_merge(shard):
            print(f"shard {shard}: a merge is already scheduled or running")
            continue
        app.send_task(Task.BM25_REBUILD.value, kwargs={"shard": shard, "merge": True})
        print(f"shard {shard}: full rebuild sent to the maintenance queue")
    print("`shardfuse wait` returns once they are published")
    return 0
