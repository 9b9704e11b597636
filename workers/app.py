"""Building the Celery application: broker, serialization, routing and delivery guarantees.

Workers use the app of :mod:`shardfuse.workers.celery_app`; clients (the CLI, the publisher) build their own from
the settings they were given.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery, signals
from kombu.entity import Queue as KombuQueue

from shardfuse.pipeline.config.settings import Settings, TaskLimits
from shardfuse.workers import readiness as _readiness  # noqa: F401  registers the shardfuse_ready command
from shardfuse.workers.broker.serialization import JSON_ONLY
from shardfuse.workers.broker.transport import SENTINEL_TRANSPORT, TLS_TRANSPORT, TRANSPORT
from shardfuse.workers.freshness import stamp_origin
from shardfuse.workers.names import PUBLISHED_HEADER, TASK_QUEUES, Queue, Task
from shardfuse.workers.runtime import RuntimeHolder

TASK_MODULES = (
    "shardfuse.workers.tasks.ingest",
    "shardfuse.workers.tasks.embed",
    "shardfuse.workers.tasks.maintenance",
    "shardfuse.workers.tasks.search",
)


# Our transport for each Redis URL scheme (the atomic receive and the envelope check on every one).
_TRANSPORTS = {"redis": TRANSPORT, "rediss": TLS_TRANSPORT, "sentinel": SENTINEL_TRANSPORT}


def broker_transport(url: str) -> str | None:
    """Our Redis transport (:mod:`shardfuse.workers.broker.transport`: the atomic receive and the envelope
    check) for every Redis broker: ``redis://``, ``rediss://`` (TLS) and ``sentinel://``. None (kombu's
    choice from the scheme) for anything else, such as ``memory://`` in a test."""
    return _TRANSPORTS.get(url.split("://", 1)[0].lower())


# celery ships no type information, so its decorators are untyped to mypy --strict.
@signals.before_task_publish.connect(weak=False)  # type: ignore[untyped-decorator]
def stamp_published(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Every message shardfuse publishes (events, documents, retries) says when: ``shardfuse status`` shows
    how long the oldest message of each queue has waited; and when its change was first published
    (:mod:`shardfuse.workers.freshness`)."""
    if headers is not None:
        headers[PUBLISHED_HEADER] = now = time.time()
        stamp_origin(headers, now=now)


def task_limits(settings: Settings) -> dict[str, dict[str, int | bool]]:
    """Celery's ``task_annotations``: each task's soft and hard time limits, those of its queue in
    ``settings.workers``, and whether the search task sends task events (``workers.search_events``). Celery
    applies them when a task binds to the app, so every app's tasks (the workers' and any other built from
    other settings) take the limits of the settings that app was built with, not of whichever settings were
    loaded when the task modules were imported."""
    workers = settings.workers
    by_queue: dict[Queue, TaskLimits] = {Queue.INGEST: workers.ingest_limits, Queue.EMBED: workers.embed_limits,
                                         Queue.MAINTENANCE: workers.maintenance_limits,
                                         Queue.QUERY: workers.query_limits}
    annotations: dict[str, dict[str, int | bool]] = {
        task.value: {"soft_time_limit": by_queue[queue].soft_s, "time_limit": by_queue[queue].hard_s}
        for task, queue in TASK_QUEUES.items()}
    annotations[Task.SEARCH.value]["send_events"] = workers.search_events
    return annotations


def create_app(settings: Settings) -> Celery:
    app = Celery("shardfuse", broker=settings.broker.url, backend=settings.broker.result_backend)
    app.conf.update(JSON_ONLY)
    app.conf.update(
        # A message is acknowledged after its effect is committed; a worker killed mid-task leaves it
        # to be redelivered. Every task is idempotent, so running twice is harmless.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # A run killed by its hard time limit goes back on its queue (Celery would acknowledge it, losing
        # every event of the message); workers/tasks/strikes.py stops one that is killed every time.
        task_acks_on_timeout=False,
        # Long tasks: take one message at a time so a busy process does not hoard the queue.
        worker_prefetch_multiplier=1,
        task_queues=[KombuQueue(q.value, routing_key=q.value) for q in Queue],  # type: ignore[no-untyped-call]
        task_default_queue=Queue.INGEST.value,
        task_routes={task.value: {"queue": queue.value, "routing_key": queue.value}
                     for task, queue in TASK_QUEUES.items()},
        task_annotations=task_limits(settings),
        broker_transport=broker_transport(settings.broker.url),
        # One list per queue (no priority steps): our transport receives a queue with BLMOVE, atomically.
        broker_transport_options={"visibility_timeout": settings.broker.visibility_timeout_s,
                                  "priority_steps": [0],
                                  # the largest item a worker takes off a queue (broker/envelope.py)
                                  "max_message_bytes": settings.broker.max_message_bytes},
        result_backend_transport_options={"visibility_timeout": settings.broker.visibility_timeout_s},
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
        include=list(TASK_MODULES),
    )
    app.shardfuse_settings = settings
    app.shardfuse_runtime = RuntimeHolder(settings)
    return app

