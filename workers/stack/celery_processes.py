"""The Celery side of the stack: one worker pool per queue, and Flower.

Both are started as ``python -m celery -A <app> …`` processes. Their settings are the launcher's, as a
file: :func:`child_env` names it in their environment (:mod:`shardfuse.pipeline.config.handoff`).
"""

from __future__ import annotations

import base64
import http.client
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kombu.exceptions import KombuError
from redis import RedisError

from shardfuse.pipeline.config.handoff import RESOLVED_SETTINGS_ENV
from shardfuse.pipeline.config.settings import Settings, WorkerSettings
from shardfuse.pipeline.core.loopback_http import open_url
from shardfuse.pipeline.observability.multiprocess import MULTIPROC_DIR_ENV
from shardfuse.workers.broker.serialization import control_app
from shardfuse.workers.names import QUEUE_POOLS, QUEUE_PREFETCH, Queue
from shardfuse.workers.stack.addresses import Endpoint, parse_redis_url
from shardfuse.workers.stack.layout import StackLayout

# The Celery application every worker and Flower loads. A module attribute (read at call time) so that
# tests can point it at a stand-in app.
CELERY_APP = "shardfuse.workers.celery_app:app"
FLOWER = "flower"
# The settings variables a child's environment does not inherit: its settings are the file alone.
SETTINGS_ENV_PREFIX = "SHARDFUSE_"
HTTP_TIMEOUT_S = 2.0

CONCURRENCY: dict[Queue, Callable[[WorkerSettings], int]] = {
    Queue.INGEST: lambda w: w.ingest_concurrency,
    Queue.EMBED: lambda w: w.embed_concurrency,
    Queue.MAINTENANCE: lambda w: w.maintenance_concurrency,
    Queue.QUERY: lambda w: w.query_concurrency,
}


def worker_component(queue: Queue) -> str:
    """The component name of a queue's worker pool: ``worker-ingest`` …"""
    return f"worker-{queue.value}"


def worker_nodename(queue: Queue) -> str:
    """The Celery node name a pool registers as (what ``-n {queue}@%h`` expands to)."""
    return f"{queue.value}@{socket.gethostname()}"


def worker_command(queue: Queue, *, concurrency: int, app: str | None = None,
                   metrics: Endpoint | None = None) -> list[str]:
    """The command line of one queue's worker pool, with the pool type the queue needs (and where it serves
    its metrics, if ``metrics`` says; else ``workers.metrics_port`` decides)."""
    served = ["--metrics-address", metrics.host, "--metrics-port", str(metrics.port)] if metrics else []
    return [
        sys.executable, "-m", "celery", "-A", app or CELERY_APP, "worker",
        "-Q", queue.value,
        "-P", QUEUE_POOLS[queue],
        "-c", str(concurrency),
        "--prefetch-multiplier", str(QUEUE_PREFETCH[queue]),
        "-n", f"{queue.value}@%h",
        "-E",  # task events, for Flower
        # Gossip and mingle cost each worker a round trip to every other one at start; nothing uses them.
        "--without-gossip", "--without-mingle",
        "-O", "fair",
        "--loglevel", "INFO",
        *served,
    ]  # fmt: skip


def worker_marks(queue: Queue) -> tuple[str, ...]:
    """Substrings of a running worker's command line that identify it."""
    return ("celery", "worker", f"{queue.value}@%h")


def worker_commands(settings: Settings, *, app: str | None = None) -> dict[str, list[str]]:
    """Component name -> command line, for every queue."""
    return {
        worker_component(queue): worker_command(queue, concurrency=CONCURRENCY[queue](settings.workers), app=app,
                                                metrics=worker_metrics(settings, queue))
        for queue in Queue
    }


# -- metrics: each pool of the embedded stack serves /metrics on loopback and counts into a directory of its own
# (shardfuse.workers.observability, shardfuse.pipeline.observability.multiprocess).


def worker_metrics(settings: Settings, queue: Queue) -> Endpoint | None:
    """Where the embedded stack's pool of ``queue`` serves ``/metrics``: the broker's loopback host, port
    ``stack.metrics_port`` for ingest and the next ones for embed, maintenance and query (Queue's order);
    None when ``stack.metrics_port`` is 0."""
    if not settings.stack.metrics_port:
        return None
    return Endpoint(parse_redis_url(settings.broker.url).host, settings.stack.metrics_port + list(Queue).index(queue))


def worker_env(base: Mapping[str, str], settings: Settings, queue: Queue) -> dict[str, str]:
    """``base`` plus the pool's own ``PROMETHEUS_MULTIPROC_DIR`` (``<data_dir>/run/metrics/<queue>``): it must
    be in the worker's environment before prometheus_client is imported there."""
    directory = StackLayout(settings.data_path).run_dir / "metrics" / queue.value
    return {**base, MULTIPROC_DIR_ENV: str(directory)}


def flower_command(*, endpoint: Endpoint, db: str, app: str | None = None) -> list[str]:
    """The Flower command line.

    The basic-auth credentials are not on it: they go in ``FLOWER_BASIC_AUTH`` (see :func:`flower_env`),
    so the password shows neither in ``ps`` nor in the recorded state.
    """
    return [
        sys.executable, "-m", "celery", "-A", app or CELERY_APP, "flower",
        f"--address={endpoint.host}",
        f"--port={endpoint.port}",
        "--persistent=True",
        f"--db={db}",
    ]  # fmt: skip


def flower_marks(endpoint: Endpoint) -> tuple[str, ...]:
    """Substrings of the running Flower's command line that identify it."""
    return ("celery", "flower", f"--port={endpoint.port}")


def child_env(base: Mapping[str, str], settings_file: Path) -> dict[str, str]:
    """The environment of a worker or Flower: ``base`` without its ``SHARDFUSE_*`` variables, plus
    ``SHARDFUSE_RESOLVED_SETTINGS`` naming the launcher's resolved settings. The child reads its settings
    from that file alone; copies of the launcher's variables would only mislead whoever reads them."""
    env = {name: value for name, value in base.items() if not name.upper().startswith(SETTINGS_ENV_PREFIX)}
    env[RESOLVED_SETTINGS_ENV] = str(settings_file)
    return env


def flower_env(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` plus Flower's basic-auth credentials (Flower reads ``FLOWER_<OPTION>`` variables)."""
    password = settings.flower.password.get_secret_value()
    return {**base, "FLOWER_BASIC_AUTH": f"{settings.flower.user}:{password}"}


def answering_workers(broker_url: str, nodenames: Iterable[str], *, timeout: float = 1.0) -> set[str]:
    """The node names among ``nodenames`` that answer a Celery ping through the broker."""
    wanted = list(nodenames)
    if not wanted:
        return set()
    app = control_app(broker_url)
    try:
        replies = app.control.ping(destination=wanted, timeout=timeout) or []
    except (KombuError, RedisError, OSError):
        return set()
    finally:
        app.close()
    return {node for reply in replies for node in reply} & set(wanted)


def worker_readiness(broker_url: str, nodename: str, *, timeout: float = 1.0) -> dict[str, Any]:
    """What ``nodename`` answers to ``shardfuse_ready`` (:mod:`shardfuse.workers.readiness`); ``{}`` when it does
    not answer (an older worker, or gone since its ping)."""
    app = control_app(broker_url)
    try:
        replies = app.control.broadcast("shardfuse_ready", destination=[nodename], reply=True,
                                        timeout=timeout) or []
    except (KombuError, RedisError, OSError):
        return {}
    finally:
        app.close()
    for reply in replies:
        answer = reply.get(nodename)
        if isinstance(answer, dict):
            return answer
    return {}


def flower_ready(url: str, *, user: str, password: str) -> bool:
    """True if Flower serves ``url`` with the credentials (200) and refuses it without them (401)."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    authorised = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    return _http_status(authorised) == 200 and _http_status(urllib.request.Request(url)) == 401


def _http_status(request: urllib.request.Request) -> int | None:
    try:
        with open_url(request, timeout=HTTP_TIMEOUT_S) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return None  # nothing listening yet, or something that is not an HTTP server (not Flower, then)
