"""The publisher API: put bytes in the CAS, then publish the write event that names them."""

from __future__ import annotations

import mimetypes
import time
from collections.abc import Callable
from typing import Any, Protocol

from pipeline.cas import ContentStore
from pipeline.events import Op, WriteEvent


class EventSink(Protocol):
    """Where events go: the ``ingest`` queue in production, a list in unit tests."""

    def send(self, event: WriteEvent) -> None: ...


class Publisher:
    """Publishes writes and deletes of ``(zone, path)``.

    ``seq`` defaults to the wall clock in nanoseconds, which orders the events of one path as long as
    they are published from one machine (or clocks agree to better than the gap between two writes of a
    path). A store with its own version counter should pass it as ``seq``.
    """

    def __init__(self, *, cas: ContentStore, sink: EventSink, clock: Callable[[], int] = time.time_ns) -> None:
        self._cas = cas
        self._sink = sink
        self._clock = clock

    def write(
        self,
        *,
        zone: str,
        path: str,
        data: bytes,
        mime: str | None = None,
        metadata: dict[str, Any] | None = None,
        seq: int | None = None,
    ) -> WriteEvent:
        """Store ``data`` and publish its write event. The content is in the CAS before the event exists,
        so a worker never sees an event whose content is missing."""
        event = WriteEvent(
            op=Op.WRITE,
            zone=zone,
            path=path,
            content_hash=self._cas.put(data),
            size=len(data),
            mime=mime or mimetypes.guess_type(path)[0],
            seq=self._clock() if seq is None else seq,
            metadata=metadata,
        )
        self._sink.send(event)
        return event

    def delete(self, *, zone: str, path: str, seq: int | None = None) -> WriteEvent:
        event = WriteEvent(op=Op.DELETE, zone=zone, path=path, seq=self._clock() if seq is None else seq)
        self._sink.send(event)
        return event
