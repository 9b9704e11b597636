"""``shardfuse reindex start | status | switch | finish | abort``: move a zone to another embedding model
side by side, with no downtime, and switch its queries over at once (``pipeline/admin/reindex.py``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import redis
from tqdm import tqdm

from shardfuse.pipeline.admin.reindex import Progress, ZoneReindex
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.embed.providers import build_embedder
from shardfuse.pipeline.embed.stage import EmbeddingStage
from shardfuse.pipeline.index.store import ShardPools, zone_models
from shardfuse.pipeline.index.store.connections import pooled_connection
from shardfuse.pipeline.index.store.pools import build_settings
from shardfuse.pipeline.index.store.schema import ensure_shared_schema
from shardfuse.workers.cli import arguments
from shardfuse.workers.embedding_models import build_stage


def register(sub: Any) -> None:
    p = sub.add_parser("reindex", help="move a zone to another embedding model side by side, then switch over")
    steps = p.add_subparsers(dest="step", required=True, metavar="STEP")
    for step, text in (
        ("start", "write the zone with both models from now on, backfill its chunks, build the new index"),
        ("switch", "make the model the zone's, for every query at once (fills what is missing first)"),
        ("finish", "after a switch: stop writing the zone's previous model"),
        ("abort", "before a switch: give the reindex up; writes go back to the zone's model alone"),
    ):
        s = steps.add_parser(step, help=text)
        s.add_argument("--zone", required=True, type=arguments.zone)
        s.add_argument("--model", required=True, help="a model declared as [embedders.<name>], or 'default'")
        s.add_argument("--batch-size", type=arguments.positive_int, default=256,
                       help="chunks embedded and written per step")
        s.set_defaults(handler=run_step)
    s = steps.add_parser("status", help="every zone's model, reindexes in progress, and per shard what is left")
    s.add_argument("--zone", help="only this zone")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.set_defaults(handler=run_status)


def _stage(settings: Settings, pools: ShardPools, model: str) -> EmbeddingStage:
    embedder_settings = settings.embedder_for(model)
    embedder = build_embedder(embedder_settings, models_dir=settings.models_dir)
    return build_stage(embedder_settings, embedder, shared_pool=pools.shared,
                       redis_client=redis.Redis.from_url(settings.broker.url))


def _progress(what: str) -> tuple[Progress, Any]:
    bar = tqdm(desc=what, unit="chunk", file=sys.stderr, disable=None)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update, bar


def run_step(args: argparse.Namespace, settings: Settings) -> int:
    with ShardPools(settings, min_size=1, max_size=2) as pools:
        job = ZoneReindex(settings=settings, stores=pools.stores(), shared_pool=pools.shared, zone=args.zone,
                          model=args.model, build=build_settings(settings.vector_index), batch_size=args.batch_size)
        if args.step in ("start", "switch"):
            stage = _stage(settings, pools, args.model)
            progress, bar = _progress(f"embedding zone {args.zone} with {args.model}")
            try:
                if args.step == "start":
                    state = job.start()
                    print(f"zone {args.zone}: writes now fill {state.active} and {args.model}; backfilling",
                          file=sys.stderr)
                    job.backfill(stage, progress=progress)
                    print(f"zone {args.zone}: building the HNSW index of {args.model} on every shard", file=sys.stderr)
                    job.build_indexes()
                else:
                    state = job.switch(stage, progress=progress)
                    # Query workers read the zone's model at most this long ago: once it has passed, every
                    # query uses the new one.
                    time.sleep(2 * zone_models.ACTIVE_MODELS_TTL_S)
            finally:
                bar.close()
                stage.close()
        else:
            state = job.finish() if args.step == "finish" else job.abort()
        _print_shards(job)
    messages = {
        "start": f"ready: compare with `shardfuse search QUERY --zone {args.zone} --model {args.model}`, then "
                 f"`shardfuse reindex switch --zone {args.zone} --model {args.model}`",
        "switch": f"zone {args.zone} now searches with {state.active} (previous: {state.previous}); "
                  f"`shardfuse reindex finish --zone {args.zone} --model {state.active}` stops writing "
                  f"{state.previous}",
        "finish": f"zone {args.zone} is written with {state.active} alone",
        "abort": f"zone {args.zone} stays on {state.active}; the reindex to {args.model} is given up",
    }
    print(messages[args.step])
    return 0


def _print_shards(job: ZoneReindex) -> None:
    for r in job.report():
        print(f"  shard {r.shard}: {r.chunks} chunk(s), {r.missing} without a {job.model} vector, "
              f"index {'built' if r.index else 'not built'}", file=sys.stderr)


def run_status(args: argparse.Namespace, settings: Settings) -> int:
    with ShardPools(settings, min_size=1, max_size=2) as pools:
        with pooled_connection(pools.shared, what="the zone models") as conn:
            ensure_shared_schema(conn)
            states = [s for s in zone_models.all_zone_models(conn) if args.zone in (None, s.zone)]
        zones = []
        for state in states:
            entry: dict[str, Any] = {"zone": state.zone, "active": state.active, "target": state.target,
                                     "previous": state.previous,
                                     "started_at": state.started_at, "switched_at": state.switched_at}
            if state.target is not None:
                job = ZoneReindex(settings=settings, stores=pools.stores(), shared_pool=pools.shared,
                                  zone=state.zone, model=state.target)
                entry["shards"] = [{"shard": r.shard, "chunks": r.chunks, "missing": r.missing, "index": r.index}
                                   for r in job.report()]
            zones.append(entry)
    if args.json:
        print(json.dumps({"zones": zones}, default=str))
        return 0
    if not zones:
        print("every zone uses the default model ([embedder])" if args.zone is None
              else f"zone {args.zone} uses the default model ([embedder])")
    for entry in zones:
        line = f"{entry['zone']}: {entry['active']}"
        if entry["target"]:
            left = sum(s["missing"] for s in entry["shards"])
            line += f", reindexing to {entry['target']} ({left} chunk(s) left)"
        if entry["previous"]:
            line += f", still writing {entry['previous']} (reindex finish stops it)"
        print(line)
    return 0
