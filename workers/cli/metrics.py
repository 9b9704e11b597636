"""``shardfuse exporter``: Prometheus gauges of the whole deployment's state at ``/metrics`` (queues, index
lag, dead letters: :mod:`shardfuse.workers.exporter`).

One exporter per deployment is enough: it reads shared state only. The counters and histograms (events,
embeddings, provider calls, query durations) are served by each worker pool at its own ``/metrics``
(``workers.metrics_port``), and Flower serves Celery's task and worker metrics at its ``/metrics``.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.cli import arguments
from shardfuse.workers.exporter import ShardfuseCollector

DEFAULT_PORT = 9808


def register(sub: Any) -> None:
    p = sub.add_parser("exporter",
                       help="serve Prometheus metrics of the deployment (queues, index lag, dead letters) at /metrics")
    p.add_argument("--address", default="0.0.0.0", help="address to listen on (default: every interface)")
    p.add_argument("--port", type=arguments.port, default=DEFAULT_PORT,
                   help=f"port to listen on (default: {DEFAULT_PORT})")
    p.set_defaults(handler=run_exporter)


def run_exporter(args: argparse.Namespace, settings: Settings) -> int:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ShardfuseCollector(settings))
    server, thread = start_http_server(args.port, addr=args.address, registry=registry)
    host, port = server.server_address[:2]  # (str, int): an AF_INET/AF_INET6 server; typeshed allows bytes
    host = host.decode() if isinstance(host, bytes) else host
    print(f"serving shardfuse metrics at http://{host}:{port}/metrics", flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    thread.join(5)
    return 0
