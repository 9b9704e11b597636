"""Freshness: how long a change took from its publication to its commit in its shard
(:data:`~shardfuse.pipeline.observability.metrics.FRESHNESS`, the dashboard's freshness panel and the freshness
SLO's alerts in ``config/prometheus/alerts.yml``).

A change crosses several messages (ingest, then embed; a retry or a "busy" re-publish on the way), and each
publish stamps its own time (:data:`~shardfuse.workers.names.PUBLISHED_HEADER`, the queue-age gauges). The time
the change was first published travels beside it in :data:`ORIGIN_HEADER`: a message published while a task
runs inherits the running message's origin (Celery's ``current_task``: the follow-up of an ingest, a retry), one
published from anywhere else (the publisher, the HTTP API) starts a new one. The task that commits the change
observes ``now - origin``. A sender that knows better (a change noticed before it could be published) may
give the origin itself, in the message's headers.

The header is inert to Celery (an unknown header is copied to the task's request and nothing else), and a
message without it (published by an earlier release) falls back to its own publish time; a value that is not a
number is ignored, never an error: a metric must not stop a message.
"""

from __future__ import annotations

import math
import time
from typing import Any

from celery import current_task

from shardfuse.pipeline.observability import metrics
from shardfuse.workers.names import PUBLISHED_HEADER

ORIGIN_HEADER = "shardfuse_change_published"


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _header(request: Any, name: str) -> float | None:
    # A worker puts a message's headers on the request itself; a task run eagerly (``apply``) keeps them in
    # ``request.headers``.
    value = _seconds(request.get(name))
    if value is None and isinstance(request.get("headers"), dict):
        value = _seconds(request.get("headers").get(name))
    return value


def origin_of(request: Any) -> float | None:
    """When the change a running task's message carries was first published (seconds since the epoch), read
    from the task's ``request``; the message's own publish time when it carries no origin; None when neither
    is there."""
    if request is None:
        return None
    return _header(request, ORIGIN_HEADER) or _header(request, PUBLISHED_HEADER)


def stamp_origin(headers: dict[str, Any], *, now: float) -> None:
    """Before a message is published (``before_task_publish``): keep an origin the sender gave
    (``send_task(headers=...)``), else carry the running task's on, else start one at ``now`` (no task runs in
    this thread)."""
    running = getattr(current_task, "request", None)  # None outside a task: the proxy has no object
    headers[ORIGIN_HEADER] = _seconds(headers.get(ORIGIN_HEADER)) or origin_of(running) or now


def observe_freshness(request: Any, *, op: str, count: int, now: float | None = None) -> None:
    """Record, ``count`` times, the age of the change ``request`` (a task's request) carries, as the task
    commits ``count`` changes of kind ``op`` (``write`` | ``delete``). Nothing when the age is unknown."""
    origin = origin_of(request)
    if not count or origin is None:
        return
    age = max(0.0, (time.time() if now is None else now) - origin)
    for _ in range(count):
        metrics.observe(metrics.FRESHNESS, age, op=op)
