"""``shardfuse worker | flower | ping``: run one piece of the stack as a container's main process.

``shardfuse up`` starts the whole stack on one machine; in a container (compose, Kubernetes) each piece
runs on its own. ``worker`` and ``flower`` *replace* this process (``exec``) with the very command line the
embedded stack uses, so that the Celery worker receives the container's stop signal itself (a warm
shutdown: running tasks finish) and nothing of the CLI stays behind. ``ping`` is the liveness probe: it
asks this host's worker of one pool, through the broker, whether it answers.

The command lines are built by pure functions (:func:`worker_exec`, :func:`flower_exec`) so that tests
can check exactly what would run. The exec'd process runs with exactly the settings this command resolved
(its ``--config`` and ``--data-dir`` included): they are written to a private file in the container's own
temp dir (its data dir may be shared with other containers, or not mounted at all, as Flower's is in
Kubernetes), which its environment names (:mod:`shardfuse.pipeline.config.handoff`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from kombu.connection import Connection
from kombu.exceptions import KombuError
from redis import RedisError

from shardfuse.pipeline.config.handoff import write_settings_file
from shardfuse.pipeline.config.redaction import redact_url
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.workers.cli import arguments
from shardfuse.workers.names import Queue
from shardfuse.workers.stack import celery_processes
from shardfuse.workers.stack.addresses import Endpoint
from shardfuse.workers.stack.layout import StackLayout

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_FLOWER_ADDRESS = "0.0.0.0"  # in a container: reachable through the published port
DEFAULT_FLOWER_PORT = 5555
DEFAULT_PING_TIMEOUT_S = 5.0
QUEUE_NAMES = [queue.value for queue in Queue]


@dataclass(frozen=True)
class Exec:
    """A program to replace this process with: ``argv[0]`` is the executable's path."""

    argv: list[str]
    env: dict[str, str]


def register(sub: Any) -> None:
    p = sub.add_parser("worker", help="run one queue's Celery worker pool in the foreground (a container's process)")
    p.add_argument("queue", choices=QUEUE_NAMES, help="the queue the pool consumes")
    p.add_argument("--concurrency", type=arguments.positive_int, metavar="N",
                   help="processes or threads of the pool (default: settings workers.<queue>_concurrency)")
    p.add_argument("--loglevel", type=str.upper, choices=LOG_LEVELS, default="INFO", help="Celery's log level")
    p.set_defaults(handler=run_worker)

    p = sub.add_parser("flower", help="run Flower (Celery monitoring, basic auth from settings) in the foreground")
    p.add_argument("--address", default=DEFAULT_FLOWER_ADDRESS, help="listen address (default %(default)s)")
    p.add_argument("--port", type=arguments.port, default=DEFAULT_FLOWER_PORT, help="listen port (default %(default)s)")
    p.add_argument("--db", metavar="PATH", help="Flower's persistent state (default <data_dir>/flower/flower.db)")
    p.set_defaults(handler=run_flower)

    p = sub.add_parser("ping", help="exit 0 if this host's worker of a pool answers a ping through the broker")
    p.add_argument("queue", choices=QUEUE_NAMES, help="the pool to ask")
    p.add_argument("--timeout", type=arguments.positive_float, default=DEFAULT_PING_TIMEOUT_S,
                   help="seconds to wait for the answer (default %(default)s)")
    p.add_argument("--node", help="the Celery node name to ask (default <queue>@<this host's name>)")
    p.set_defaults(handler=run_ping)  # fmt: skip


# -- pure: what would run ----------------------------------------------------------------------------------


def worker_exec(queue: Queue, settings: Settings, *, base_env: Mapping[str, str], settings_file: Path,
                concurrency: int | None = None, loglevel: str = "INFO") -> Exec:
    """The worker pool of ``queue``, as the embedded stack starts it (pool type, prefetch, ``-n queue@%h``,
    events), with ``concurrency`` (default: the settings') and Celery's log level; its settings are
    ``settings_file`` (``settings``, written by :func:`write_settings_file`)."""
    if concurrency is None:
        concurrency = celery_processes.CONCURRENCY[queue](settings.workers)
    argv = celery_processes.worker_command(queue, concurrency=concurrency)
    argv[argv.index("--loglevel") + 1] = loglevel
    return Exec(argv=argv, env=celery_processes.child_env(base_env, settings_file))


def flower_db(settings: Settings, db: str | None) -> Path:
    """Where Flower keeps its state: ``db`` if given, else ``<data_dir>/flower/flower.db``."""
    return Path(db).expanduser().resolve() if db else StackLayout(settings.data_path).flower_db


def require_flower_login(settings: Settings) -> None:
    """ConfigurationError unless Flower has a user and a password: without them it would serve the broker's
    whole task history, and its control API, to anyone."""
    if not settings.flower.password.get_secret_value():
        raise ConfigurationError("flower.password is empty; set SHARDFUSE_FLOWER__PASSWORD "
                                 "(Flower is not run without authentication)")
    if not settings.flower.user:
        raise ConfigurationError("flower.user is empty; set SHARDFUSE_FLOWER__USER")


def flower_exec(settings: Settings, *, base_env: Mapping[str, str], settings_file: Path,
                address: str = DEFAULT_FLOWER_ADDRESS, port: int = DEFAULT_FLOWER_PORT, db: str | None = None) -> Exec:
    """Flower on ``address:port`` with persistent state; the basic-auth credentials travel in its
    environment (``FLOWER_BASIC_AUTH``), never on the command line. An empty password is refused
    (:func:`require_flower_login`)."""
    require_flower_login(settings)
    argv = celery_processes.flower_command(endpoint=Endpoint(address, port), db=str(flower_db(settings, db)))
    return Exec(argv=argv, env=celery_processes.flower_env(settings, celery_processes.child_env(base_env,
                                                                                                settings_file)))


def ping_node(queue: Queue, node: str | None) -> str:
    """The node name ``shardfuse ping`` asks: ``node``, else the one this host's pool registers as."""
    return node or celery_processes.worker_nodename(queue)


# -- handlers ----------------------------------------------------------------------------------------------


def run_worker(args: argparse.Namespace, settings: Settings) -> int:
    _exec(worker_exec(Queue(args.queue), settings, base_env=os.environ, settings_file=write_settings_file(settings),
                      concurrency=args.concurrency, loglevel=args.loglevel))


def run_flower(args: argparse.Namespace, settings: Settings) -> int:
    require_flower_login(settings)
    flower_db(settings, args.db).parent.mkdir(parents=True, exist_ok=True)
    if settings.flower.password.get_secret_value() == "shardfuse":
        print("shardfuse flower: warning: flower.password is the built-in default; set SHARDFUSE_FLOWER__PASSWORD",
              file=sys.stderr)
    _exec(flower_exec(settings, base_env=os.environ, settings_file=write_settings_file(settings),
                      address=args.address, port=args.port, db=args.db))


def run_ping(args: argparse.Namespace, settings: Settings) -> int:
    node = ping_node(Queue(args.queue), args.node)
    broker = redact_url(settings.broker.url)
    problem = broker_problem(settings.broker.url, timeout=args.timeout)
    if problem is not None:
        print(f"shardfuse ping: broker {broker} is unreachable: {problem}", file=sys.stderr)
        return 1
    if node in celery_processes.answering_workers(settings.broker.url, [node], timeout=args.timeout):
        state = celery_processes.worker_readiness(settings.broker.url, node, timeout=args.timeout)
        if state.get("ready") is False:
            print(f"shardfuse ping: {node} answers but is not ready: {json.dumps(state, sort_keys=True)}",
                  file=sys.stderr)
            return 1
        print(f"{node}: pong")
        return 0
    print(f"shardfuse ping: {node} did not answer within {args.timeout:g}s through broker {broker} "
          "(not started, still starting, stuck, or listening to another broker)", file=sys.stderr)
    return 1


def broker_problem(url: str, *, timeout: float) -> str | None:
    """Why the broker cannot be reached (one attempt, bounded by ``timeout``), or None if it can.

    Checked before the ping so that the probe says which of the two is wrong, and fails at once rather
    than after the ping's own connection retries.
    """
    try:
        # kombu's Connection has no annotations.
        with Connection(url, connect_timeout=timeout) as connection:  # type: ignore[no-untyped-call]
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
    except (KombuError, RedisError, OSError) as exc:
        return str(exc) or type(exc).__name__
    return None


def _exec(spec: Exec) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(spec.argv[0], spec.argv, spec.env)
