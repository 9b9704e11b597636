"""A worker's metrics and log lines: wired to Celery's signals (see :mod:`shardfuse.pipeline.observability.metrics`,
:mod:`shardfuse.workers.logs`).

- Metrics: a worker flushes its counts to the broker's Redis. The recorder is connected when the worker
  starts (``worker_init``, before a prefork pool forks; each child starts a flusher of its own at its first
  count) and flushed when a pool process or the worker stops: a prefork child ends with ``os._exit``, so
  its ``atexit`` flush would never run.
- Logs: with ``[logging] format = "json"``, the handlers Celery sets up (root and task loggers) write JSON
  lines; every line of a task carries its name, id and worker node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery, signals

from shardfuse.pipeline.observability import metrics
from shardfuse.workers.logs import set_log_fields, use_format


def connect_observability(app: Celery) -> Callable[[], None]:
    """Connect the receivers below to Celery's signals; returns what disconnects them (for tests)."""
    settings = app.shardfuse_settings  # type: ignore[attr-defined]
    log_format = settings.logging.format

    def count_into_redis(**_: Any) -> None:
        metrics.connect_redis(settings.broker.url)

    def last_flush(**_: Any) -> None:
        metrics.recorder().close()

    def formats(logger: Any = None, **_: Any) -> None:
        if logger is not None:
            use_format(logger.handlers, log_format)

    def task_started(task_id: str | None = None, task: Any = None, **_: Any) -> None:
        request = getattr(task, "request", None)
        set_log_fields({"task": getattr(task, "name", None), "task_id": task_id,
                        "worker": getattr(request, "hostname", None)})

    def task_ended(**_: Any) -> None:
        set_log_fields({})

    receivers = [
        (signals.worker_init, count_into_redis),
        (signals.worker_process_shutdown, last_flush),
        (signals.worker_shutdown, last_flush),
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
