"""The publisher's event sink: write events onto the ``ingest`` queue as Celery task messages."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.core.events import WriteEvent
from shardfuse.pipeline.observability import metrics
from shardfuse.workers.app import create_app
from shardfuse.workers.broker.headroom import BrokerHeadroom, RedisMemory
from shardfuse.workers.monitor import broker_client
from shardfuse.workers.names import Task
from shardfuse.workers.task_reprs import kwargs_summary


class CeleryEventSink:
    """Sends events as ``shardfuse.ingest`` messages of up to ``events_per_message`` events each, over one
    reused broker connection.

    Events are held until a message is full, :meth:`flush` is called, or the :meth:`connect` block ends
    (which flushes: leaving the block normally means every event was published). A broker out of reach is a
    :class:`StoreUnavailableError` naming it (``broker``: its URL with the password masked), and so is a
    broker past its publishing high-water mark (:mod:`shardfuse.workers.broker.headroom`); the events of a
    message it refused are kept for the next flush.
    """

    def __init__(self, app: Celery, producer: Any, *, events_per_message: int = 1, refresh: bool = False,
                 broker: str = "", headroom: BrokerHeadroom | None = None) -> None:
        if events_per_message < 1:
            raise ValueError(f"events_per_message must be at least 1, got {events_per_message}")
        self._app = app
        self._producer = producer
        self._per_message = events_per_message
        self._refresh = refresh  # re-index at the seq the shards hold (backfill-context)
        self._broker = f"the broker at {broker}" if broker else "the broker"
        self._held: list[dict[str, Any]] = []
        self._headroom = headroom
        self.messages = 0

    @classmethod
    @contextmanager
    def connect(
        cls, settings: Settings, *, events_per_message: int | None = None, refresh: bool = False
    ) -> Iterator[CeleryEventSink]:
        app = create_app(settings)
        per_message = settings.broker.events_per_message if events_per_message is None else events_per_message
        broker = settings.broker.display_url
        memory = RedisMemory(lambda: broker_client(settings))
        headroom = BrokerHeadroom(memory, high_water=settings.broker.publish_high_water,
                                  broker=f"the broker at {broker}")
        try:
            with contextlib.closing(memory), app.producer_or_acquire() as producer:
                sink = cls(app, producer, events_per_message=per_message, refresh=refresh, broker=broker,
                           headroom=headroom)
                try:
                    yield sink
                finally:  # also when the caller stops early: what it sent so far is published
                    sink.flush()
        except OperationalError as exc:
            raise StoreUnavailableError(f"cannot reach the broker at {broker}: {exc}") from exc

    def send(self, event: WriteEvent) -> None:
        self._held.append(event.model_dump(mode="json"))
        if len(self._held) >= self._per_message:
            self.flush()

    def flush(self) -> None:
        """Publish the events held so far."""
        if not self._held:
            return
        if self._headroom is not None:
            self._headroom.check()  # the events stay held: the next flush tries again
        events, self._held = self._held, []
        kwargs: dict[str, Any] = {"event": events[0]} if len(events) == 1 else {"events": events}
        if self._refresh:
            kwargs["refresh"] = True
        try:
            self._app.send_task(Task.INGEST.value, kwargs=kwargs, producer=self._producer, ignore_result=True,
                                kwargsrepr=kwargs_summary(kwargs))
        except OperationalError as exc:
            self._held = events + self._held  # nothing was published: keep them for another try
            raise StoreUnavailableError(f"cannot publish to {self._broker}: {exc}") from exc
        self.messages += 1
        for op, count in Counter(str(event.get("op")) for event in events).items():
            metrics.inc(metrics.EVENTS_PUBLISHED, count, op=op)
