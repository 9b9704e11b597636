"""``shardfuse exporter``: Prometheus metrics of the whole deployment at ``/metrics``.

Flower serves its own ``/metrics`` (Celery task and worker metrics); this one serves shardfuse's
(:mod:`shardfuse.workers.exporter`). One exporter per deployment is enough: it reads shared state only.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.exporter import ShardfuseCollector

DEFAULT_PORT = 9808


def register(sub: Any) -> None:
    p = sub.add_parser("exporter", help="serve Prometheus metrics (counters, queues, index lag) at /metrics")
    p.add_argument("--address", default="0.0.0.0", help="address to listen on (default: every interface)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default: {DEFAULT_PORT})")
    p.set_defaults(handler=run_exporter)


def run_exporter(args: argparse.Namespace, settings: Settings) -> int:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ShardfuseCollector(settings))
    server, thread = start_http_server(args.port, addr=args.address, registry=registry)
    host, port = server.server_address[:2]
    print(f"serving shardfuse metrics at http://{host}:{port}/metrics", flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    thread.join(5)
    return 0
