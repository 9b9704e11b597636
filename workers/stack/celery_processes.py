"""The Celery side of the stack: one worker pool per queue, and Flower.

Both are started as ``python -m celery -A <app> …`` subprocesses. They inherit this process's
environment, which is how settings reach them: ``SHARDFUSE_*`` variables and ``SHARDFUSE_CONFIG``.
"""

from __future__ import annotations

import base64
import os
import site
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from kombu.exceptions import KombuError
from redis import RedisError

from shardfuse.pipeline.config.settings import Settings, WorkerSettings
from shardfuse.workers.broker.serialization import control_app
from shardfuse.workers.names import QUEUE_POOLS, QUEUE_PREFETCH, Queue
from shardfuse.workers.stack.addresses import Endpoint

# The Celery application every worker and Flower loads. A module attribute (read at call time) so that
# tests can point it at a stand-in app.
CELERY_APP = "shardfuse.workers.celery_app:app"
FLOWER = "flower"
# The folder that holds the ``workers`` package (a checkout's root, or site-packages).
SOURCE_ROOT = Path(__file__).resolve().parents[2]
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


def worker_command(queue: Queue, *, concurrency: int, app: str | None = None) -> list[str]:
    """The command line of one queue's worker pool, with the pool type the queue needs."""
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
    ]  # fmt: skip


def worker_marks(queue: Queue) -> tuple[str, ...]:
    """Substrings of a running worker's command line that identify it."""
    return ("celery", "worker", f"{queue.value}@%h")


def worker_commands(settings: Settings, *, app: str | None = None) -> dict[str, list[str]]:
    """Component name -> command line, for every queue."""
    return {
        worker_component(queue): worker_command(queue, concurrency=CONCURRENCY[queue](settings.workers), app=app)
        for queue in Queue
    }


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


def celery_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a worker or Flower: ``base`` (settings travel in it), plus whatever makes
    ``-A shardfuse.workers.celery_app:app`` importable.

    When shardfuse runs from a source checkout that is not pip-installed, ``workers`` is importable here
    only because the checkout is our cwd or on our sys.path; the children get its root on PYTHONPATH
    rather than a changed cwd, so that relative paths in ``SHARDFUSE_*`` variables keep their meaning.
    """
    env = dict(base)
    root = str(SOURCE_ROOT)
    if root not in site.getsitepackages() + [site.getusersitepackages()]:
        paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]
        if root not in paths:
            env["PYTHONPATH"] = os.pathsep.join([root, *paths])
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


def flower_ready(url: str, *, user: str, password: str) -> bool:
    """True if Flower serves ``url`` with the credentials (200) and refuses it without them (401)."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    authorised = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    return _http_status(authorised) == 200 and _http_status(urllib.request.Request(url)) == 401


def _http_status(request: urllib.request.Request) -> int | None:
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None
