"""Publishing content that is already in the CAS: what an upload (the HTTP API's ``POST /v1/documents``) does
once its bytes have been streamed into the store, and the checks it makes before accepting a single byte.

The event is the publisher's (:class:`~shardfuse.pipeline.core.events.WriteEvent`, ``seq`` from the wall
clock as :class:`~shardfuse.pipeline.admin.publisher.Publisher` does), so a bad zone, path or metadata is
refused with the very message ``shardfuse publish`` prints.
"""

from __future__ import annotations

import mimetypes
import time
from collections.abc import Callable
from typing import Any

from shardfuse.pipeline.admin.publisher import EventSink
from shardfuse.pipeline.core.events import Op, WriteEvent

# A well-formed hash that names nothing: lets the event's own validation check a target before content exists.
_NO_CONTENT = "sha256:" + "0" * 64
# Content types that say nothing about the content: the path's extension decides then.
GENERIC_TYPES = frozenset({"", "application/octet-stream", "application/x-www-form-urlencoded"})


def check_target(*, zone: str, path: str, metadata: dict[str, Any] | None = None) -> None:
    """:class:`~shardfuse.pipeline.core.errors.InvalidEventError` now if a write of ``(zone, path)`` with this
    metadata would be refused, so that no content is stored for an event that cannot be published."""
    WriteEvent(op=Op.WRITE, zone=zone, path=path, content_hash=_NO_CONTENT, seq=0, metadata=metadata)


def mime_for(path: str, content_type: str | None) -> str | None:
    """The event's ``mime``: the upload's content type (without parameters) unless it is generic, else the
    path's guess (as the publisher guesses it)."""
    declared = (content_type or "").split(";", 1)[0].strip().lower()
    return declared if declared not in GENERIC_TYPES else mimetypes.guess_type(path)[0]


def publish_stored(
    sink: EventSink,
    *,
    zone: str,
    path: str,
    content_hash: str,
    size: int,
    mime: str | None = None,
    metadata: dict[str, Any] | None = None,
    clock: Callable[[], int] = time.time_ns,
) -> WriteEvent:
    """Send the write event of content the CAS holds as ``content_hash`` (``size`` bytes); return it."""
    event = WriteEvent(op=Op.WRITE, zone=zone, path=path, content_hash=content_hash, size=size, mime=mime,
                       seq=clock(), metadata=metadata)
    sink.send(event)
    return event
