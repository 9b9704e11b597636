"""``shardfuse up | down | status | wait``: run and watch the embedded stack."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers import monitor
from shardfuse.workers.app import create_app
from shardfuse.workers.cli import arguments
from shardfuse.workers.names import Task
from shardfuse.workers.stack import api_process, down, read_state, up
from shardfuse.workers.status import collect_status, format_status


def register(sub: Any) -> None:
    p = sub.add_parser("up", help="start Redis, PostgreSQL+pgvector, the worker pools and Flower on loopback")
    p.add_argument("--timeout", type=arguments.positive_float, default=180.0, help="seconds to wait for readiness")
    p.set_defaults(handler=run_up)

    p = sub.add_parser("down", help="stop exactly what `up` started")
    p.add_argument("--timeout", type=arguments.positive_float, default=30.0, help="seconds before a process is killed")
    p.set_defaults(handler=run_down)

    p = sub.add_parser("status", help="queues, shards, index freshness, skipped documents and processes")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(handler=run_status)

    p = sub.add_parser("wait", help="block until every published event is indexed and searchable")
    p.add_argument("--timeout", type=arguments.positive_float, default=600.0)
    p.set_defaults(handler=run_wait)


def run_up(args: argparse.Namespace, settings: Settings) -> int:
    state = up(settings, progress=lambda line: print(line, flush=True), timeout=args.timeout)
    api = api_process.recorded_url(settings, state)
    print(f"stack is up: broker {state.broker_url}  Flower {state.flower_url}  {f'API {api}  ' if api else ''}"
          f"data {state.data_dir}")
    return 0


def run_down(args: argparse.Namespace, settings: Settings) -> int:
    stopped = down(settings, timeout=args.timeout)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def run_status(args: argparse.Namespace, settings: Settings) -> int:
    status = collect_status(settings, state=read_state(settings))
    print(json.dumps(status, default=str) if args.json else format_status(status))
    return 0


def run_wait(args: argparse.Namespace, settings: Settings) -> int:
    app = create_app(settings)
    tty = sys.stderr.isatty()
    last = ""

    def show(state: dict[str, Any]) -> None:
        nonlocal last
        pending = ", ".join(f"{q} {n}" for q, n in state["pending"].items())
        stale = ",".join(map(str, state["stale_shards"])) or "none"
        line = f"waiting: {pending}; BM25 shards not yet current: {stale}"
        if line != last:
            print(("\r" + line.ljust(100)) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
            last = line

    def reschedule(shard: int) -> None:
        app.send_task(Task.BM25_REBUILD.value, kwargs={"shard": shard})

    done = monitor.wait_until_indexed(settings, timeout=args.timeout, on_progress=show, reschedule=reschedule)
    if tty:
        print(file=sys.stderr)
    if not done:
        print(f"shardfuse wait: not everything was indexed within {args.timeout:g}s "
              "(see `shardfuse status`)", file=sys.stderr)
        return 1
    print("everything published is indexed and searchable")
    return 0
