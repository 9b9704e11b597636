"""The publisher's event sink: write events onto the ``ingest`` queue as Celery task messages."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError

from pipeline.errors import StoreUnavailableError
from pipeline.events import WriteEvent
from pipeline.settings import Settings
from workers.app_factory import create_app
from workers.names import Task


class CeleryEventSink:
    """Sends each event as a ``shardfuse.ingest`` message over one reused broker connection."""

    def __init__(self, app: Celery, producer: Any) -> None:
        self._app = app
        self._producer = producer

    @classmethod
    @contextmanager
    def connect(cls, settings: Settings) -> Iterator[CeleryEventSink]:
        app = create_app(settings)
        try:
            with app.producer_or_acquire() as producer:
                yield cls(app, producer)
        except OperationalError as exc:
            raise StoreUnavailableError(f"cannot reach the broker at {settings.broker.url}: {exc}") from exc

    def send(self, event: WriteEvent) -> None:
        try:
            self._app.send_task(Task.INGEST.value, kwargs={"event": event.model_dump(mode="json")},
                                producer=self._producer)
        except OperationalError as exc:
            raise StoreUnavailableError(f"cannot publish to the broker: {exc}") from exc
