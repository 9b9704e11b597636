"""A worker's metrics endpoint and log lines, wired to Celery's signals (see
:mod:`shardfuse.pipeline.observability.metrics`, :mod:`shardfuse.workers.logs`).

- Metrics: the pool's main process serves ``/metrics`` for every process of the pool (port
  ``workers.metrics_port``, or the worker's ``--metrics-port`` option, which the embedded stack gives each
  pool; 0: none) and announces its URL in Redis for ``shardfuse status``. In a prefork pool the children
  count into the pool's ``PROMETHEUS_MULTIPROC_DIR`` (set in the worker's environment by whoever starts it),
  which the main process empties at ``worker_init``, before it forks; a child marks itself dead as it exits
  (``worker_process_shutdown``). A prefork pool without that directory would serve its main process's counts
  only, which are none: it serves nothing and says why in its log.
- Logs: with ``[logging] format = "json"``, the handlers Celery sets up (root and task loggers) write JSON
  lines; every line of a task carries its name, id and worker node.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import redis
from celery import Celery, signals

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.observability import multiprocess
from shardfuse.pipeline.observability.endpoint_directory import Announcer, EndpointDirectory, PoolEndpoint
from shardfuse.pipeline.observability.metrics_server import MetricsServer
from shardfuse.workers.logs import set_log_fields, use_format
from shardfuse.workers.own_worker import OwnWorker

log = logging.getLogger(__name__)
ALL_INTERFACES = "0.0.0.0"
_REDIS_TIMEOUT_S = 5.0
# Celery's pool names (-P) whose tasks run in forked children.
_FORKING_POOLS = ("prefork", "processes")
_WORKER_OPTIONS = (
    click.Option(["--metrics-port"], type=click.IntRange(0, 65535), default=None,
                 help="serve the pool's Prometheus metrics on this port (default: workers.metrics_port; 0: none)"),
    click.Option(["--metrics-address"], default=ALL_INTERFACES, show_default=True,
                 help="the address the metrics endpoint listens on"),
)


def _forks(pool_cls: Any) -> bool:
    name = pool_cls if isinstance(pool_cls, str) else f"{pool_cls.__module__}.{pool_cls.__name__}"
    return any(kind in name for kind in _FORKING_POOLS)


class PoolMetrics:
    """The metrics endpoint of this worker process's pool, through the pool's lifecycle (one per app)."""

    def __init__(self, settings: Settings, *, redis_client: Callable[[], redis.Redis] | None = None) -> None:
        self._settings = settings
        self._redis_client = redis_client or (lambda: redis.Redis.from_url(
            settings.broker.url, socket_connect_timeout=_REDIS_TIMEOUT_S, socket_timeout=_REDIS_TIMEOUT_S))
        self.directory: Path | None = None
        self.server: MetricsServer | None = None
        self._announcer: Announcer | None = None
        self._main_pid = 0

    def pool_starts(self, sender: Any = None, **_: Any) -> None:
        """``worker_init``, in the main process before the pool forks: empty the directory, serve, announce."""
        self._main_pid = os.getpid()
        self.directory = multiprocess.multiprocess_dir()
        if self.directory is not None:
            multiprocess.clean_directory(self.directory)
        options = getattr(sender, "options", None) or {}
        port = options.get("metrics_port")
        port = self._settings.workers.metrics_port if port is None else port
        if not port:
            return
        if self.directory is None and _forks(getattr(sender, "pool_cls", "")):
            log.error("metrics not served: a prefork pool needs %s (a directory of its own) in its environment "
                      "to add up its processes' counts", multiprocess.MULTIPROC_DIR_ENV)
            return
        address = options.get("metrics_address") or ALL_INTERFACES
        try:
            self.server = MetricsServer(multiprocess.pool_registry(self.directory), address=address, port=port)
        except OSError as exc:
            log.error("metrics not served: cannot listen on %s:%s: %s", address, port, exc)
            return
        log.info("serving the pool's metrics at %s", self.server.url)
        node = str(getattr(sender, "hostname", "") or "")
        directory = EndpointDirectory(self._redis_client(), stale_after_s=self._settings.delivery.dead_after_s)
        self._announcer = Announcer(directory, PoolEndpoint(node=node, url=self.server.url),
                                    interval_s=self._settings.delivery.heartbeat_s).start()

    def child_starts(self, **_: Any) -> None:
        """``worker_process_init``, in a forked child: the listening socket is the parent's business. (The
        solo pool sends it in the main process itself, which keeps serving.)"""
        if self.server is not None and os.getpid() != self._main_pid:
            self.server.close_in_child()
            self.server = None
        self._announcer = None  # its thread stayed in the parent

    def child_exits(self, pid: int | None = None, **_: Any) -> None:
        """``worker_process_shutdown``, in the child as it exits."""
        if self.directory is not None and pid is not None:
            multiprocess.mark_process_dead(pid, self.directory)

    def pool_stops(self, **_: Any) -> None:
        """``worker_shutdown``, in the main process: withdraw the endpoint, then stop serving."""
        if self._announcer is not None:
            self._announcer.stop()
            self._announcer = None
        if self.server is not None:
            self.server.stop()
            self.server = None


class _OwnPool:
    """A pool's metrics receivers, acting for this app's worker only."""

    def __init__(self, metrics: PoolMetrics, own: OwnWorker) -> None:
        self.metrics = metrics
        self.own = own

    def pool_starts(self, sender: Any = None, **_: Any) -> None:
        if self.own.mark_if_ours(sender):
            self.metrics.pool_starts(sender=sender)

    def child_starts(self, **_: Any) -> None:
        if self.own.runs_here:
            self.metrics.child_starts()

    def child_exits(self, pid: int | None = None, **_: Any) -> None:
        if self.own.runs_here:
            self.metrics.child_exits(pid=pid)

    def pool_stops(self, sender: Any = None, **_: Any) -> None:
        if self.own.stopping(sender):
            self.metrics.pool_stops()


def connect_observability(app: Celery) -> Callable[[], None]:
    """Connect the receivers below to Celery's signals and add the worker's ``--metrics-port`` and
    ``--metrics-address`` options; returns what disconnects the receivers (for tests). The pool's endpoint
    follows this app's worker only, not another app's started in the same process
    (:mod:`shardfuse.workers.own_worker`): that one would empty this pool's metrics directory and serve and
    announce a second endpoint."""
    settings: Settings = app.shardfuse_settings
    log_format = settings.logging.format
    known = {option.name for option in app.user_options["worker"]}
    app.user_options["worker"].update(option for option in _WORKER_OPTIONS if option.name not in known)
    pool = _OwnPool(PoolMetrics(settings), OwnWorker(app))

    def formats(logger: Any = None, **_: Any) -> None:
        if logger is not None:
            use_format(logger.handlers, log_format)

    def task_started(task_id: str | None = None, task: Any = None, **_: Any) -> None:
        request = getattr(task, "request", None)
        set_log_fields({"task": getattr(task, "name", None), "task_id": task_id,
                        "worker": getattr(request, "hostname", None)})

    def task_ended(**_: Any) -> None:
        set_log_fields({})

    receivers: list[tuple[Any, Callable[..., None]]] = [
        (signals.worker_init, pool.pool_starts),
        (signals.worker_process_init, pool.child_starts),
        (signals.worker_process_shutdown, pool.child_exits),
        (signals.worker_shutdown, pool.pool_stops),
        (signals.after_setup_logger, formats),
        (signals.after_setup_task_logger, formats),
        (signals.task_prerun, task_started),
        (signals.task_postrun, task_ended),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)

    def disconnect() -> None:
        for signal, receiver in receivers:
            signal.disconnect(receiver)

    return disconnect
