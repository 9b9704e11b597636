"""JSON only, for every Celery app shardfuse builds: any richer content type from a compromised publisher could
run code on the workers, and monitoring events (Flower) are messages too."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from celery import Celery

JSON_ONLY: Mapping[str, object] = MappingProxyType({
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    "result_accept_content": ["json"],
    "event_serializer": "json",
})


def control_app(broker_url: str) -> Celery:
    """A bare app for broadcast control commands (ping) through ``broker_url``: no tasks, JSON only."""
    app = Celery(broker=broker_url, set_as_current=False)
    app.conf.update(JSON_ONLY)
    return app
