"""The publisher API: put bytes (or a file, streamed) in the CAS, then publish the write event that names them."""

from __future__ import annotations

import mimetypes
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from shardfuse.pipeline.core.errors import ConfigurationError, PermanentError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.storage.cas import ContentStore
from shardfuse.pipeline.storage.streams import Stored


class EventSink(Protocol):
    """Where events go: the ``ingest`` queue in production, a list in unit tests."""

    def send(self, event: WriteEvent) -> None: ...


@dataclass(frozen=True, slots=True)
class Write:
    """One write for :meth:`Publisher.write_many`."""

    zone: str
    path: str
    data: bytes | Path  # the content, or a file on disk streamed into the CAS (see Publisher.write)
    mime: str | None = None
    metadata: dict[str, Any] | None = None
    seq: int | None = None

    def __post_init__(self) -> None:
        # hashlib's own TypeError ("Strings must be encoded before hashing") would not say what was meant, and a
        # str is ambiguous: the text itself, or a file's name?
        if not isinstance(self.data, bytes | bytearray | memoryview | Path):
            hint = ": encode text (text.encode()), or give a file as Path(name)" if isinstance(self.data, str) else ""
            raise TypeError(f"data must be the content as bytes, or a pathlib.Path of a file to store, not "
                            f"{type(self.data).__name__}{hint}")


def fails_alone(exc: Exception) -> bool:
    """Whether ``exc`` is one write's own failure: its file's ``OSError`` (the CAS's errors are ours, never an
    ``OSError``), a ``ValueError`` (a path, zone or metadata no event can carry), or content the store refused
    (a file that changed while it was stored), not a misconfigured or unreachable store."""
    return isinstance(exc, (OSError, ValueError, PermanentError)) and not isinstance(exc, ConfigurationError)


def why_not_published(exc: Exception) -> str:
    """One line saying why a write failed alone (an ``OSError``'s own words, without its errno prefix)."""
    return (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)


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
        data: bytes | Path,
        mime: str | None = None,
        metadata: dict[str, Any] | None = None,
        seq: int | None = None,
    ) -> WriteEvent:
        """Store ``data`` and publish its write event. The content is in the CAS before the event exists,
        so a worker never sees an event whose content is missing. ``data`` a :class:`~pathlib.Path`: that
        file, streamed into the CAS by the store's ``put_file``, so a 5 GB file costs a few MiB of memory (the
        event names the bytes stored); the file's own ``OSError`` (gone, unreadable) is raised as it is."""
        write = Write(zone=zone, path=path, data=data, mime=mime, metadata=metadata, seq=seq)
        return self._send(write, self._store(write.data))

    def write_many(self, writes: Iterable[Write], *, threads: int = 8,
                   not_published: Callable[[Write, Exception], None] | None = None) -> list[WriteEvent]:
        """:meth:`write` for many documents, in the order given, with the CAS writes on ``threads`` threads.

        Each CAS write is durable (fsync of the file and of its folder, a few ms on a disk) and almost all
        of it is spent waiting on the disk, which flushes concurrent writes together: overlapping them is
        what makes a bulk load publish at the queue's speed rather than the disk's. Each event is still
        sent only once its own content is stored. At most ``4 × threads`` contents are held at a time
        (files are streamed: a few MiB each).

        A write that fails on its own (:func:`fails_alone`: its file gone or unreadable, a path or metadata no
        event can carry, a file that changed while it was stored) is given to ``not_published`` with its error,
        and the others go on; without it, that error is raised. A store out of reach or misconfigured is
        raised either way: every write after it would fail the same way.
        """
        events: list[WriteEvent] = []
        window: deque[tuple[Write, Future[Stored]]] = deque()

        def settle(held: Write, storing: Future[Stored]) -> None:
            try:
                events.append(self._send(held, storing.result()))
            except Exception as exc:
                if not_published is None or not fails_alone(exc):
                    raise
                not_published(held, exc)

        with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="cas-put") as pool:
            for write in writes:
                window.append((write, pool.submit(self._store, write.data)))
                if len(window) >= 4 * max(1, threads):
                    settle(*window.popleft())
            while window:
                settle(*window.popleft())
        return events

    def _store(self, data: bytes | Path) -> Stored:
        """The stored content's hash and size (a file's is the stored bytes': it may have changed since
        anyone looked at it)."""
        return self._cas.put_file(data) if isinstance(data, Path) else Stored(self._cas.put(data), len(data))

    def _send(self, write: Write, stored: Stored) -> WriteEvent:
        content_hash, size = stored
        event = WriteEvent(
            op=Op.WRITE,
            zone=write.zone,
            path=write.path,
            content_hash=content_hash,
            size=size,
            mime=write.mime or mimetypes.guess_type(write.path)[0],
            seq=self._clock() if write.seq is None else write.seq,
            metadata=write.metadata,
        )
        self._sink.send(event)
        return event

    def delete(self, *, zone: str, path: str, seq: int | None = None) -> WriteEvent:
        event = WriteEvent(op=Op.DELETE, zone=zone, path=path, seq=self._clock() if seq is None else seq)
        self._sink.send(event)
        return event
