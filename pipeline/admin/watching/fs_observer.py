"""The watchdog adapter: an observer thread (inotify on Linux) that turns watchdog's events into
:class:`FsEvent`s and only enqueues them; the watcher does everything else on its own thread."""

from __future__ import annotations

import contextlib
import os
import queue
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from watchdog.events import (
    EVENT_TYPE_ATTRIB,
    EVENT_TYPE_CLOSED,
    EVENT_TYPE_CREATED,
    EVENT_TYPE_DELETED,
    EVENT_TYPE_MODIFIED,
    EVENT_TYPE_MOVED,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from shardfuse.pipeline.admin.watching.events import FsEvent, Kind
from shardfuse.pipeline.core.errors import ConfigurationError

_KINDS = {EVENT_TYPE_CREATED: Kind.CREATED, EVENT_TYPE_MODIFIED: Kind.MODIFIED, EVENT_TYPE_CLOSED: Kind.CLOSED,
          EVENT_TYPE_DELETED: Kind.DELETED, EVENT_TYPE_MOVED: Kind.MOVED}


def translate(event: FileSystemEvent) -> FsEvent | None:
    """watchdog's event as ours; None for what cannot change a document (opens, reads)."""
    kind = _KINDS.get(event.event_type)
    if event.event_type == EVENT_TYPE_ATTRIB and not event.is_directory:
        kind = Kind.MODIFIED  # a file readable again (or touched: the content hash decides)
    if kind is None:
        return None
    path = Path(os.fsdecode(event.src_path))
    dest = Path(os.fsdecode(event.dest_path)) if kind is Kind.MOVED and event.dest_path else None
    if kind is Kind.MOVED and dest is None:  # moved out of the watched tree: gone from it
        kind = Kind.DELETED
    return FsEvent(kind, path, event.is_directory, dest)


class _Enqueue(FileSystemEventHandler):
    def __init__(self, put: Callable[[FsEvent], None]) -> None:
        self._put = put

    def on_any_event(self, event: FileSystemEvent) -> None:
        translated = translate(event)
        if translated is not None:
            self._put(translated)


@contextlib.contextmanager
def observing(roots: Sequence[Path], inbox: queue.Queue[FsEvent]) -> Iterator[Callable[[], bool]]:
    """Watch ``roots`` recursively, putting every event on ``inbox``, for the length of the block. Yields a
    check that the observer thread is still running. A tree too large for the kernel's inotify limits is a
    :class:`ConfigurationError` saying which limit."""
    observer = Observer()
    handler = _Enqueue(inbox.put)
    try:
        for root in roots:
            observer.schedule(handler, os.fspath(root), recursive=True)
        observer.start()
    except OSError as exc:
        observer.stop()
        raise ConfigurationError(f"cannot watch {', '.join(map(str, roots))}: {exc.strerror or exc} "
                                 "(on Linux, raise fs.inotify.max_user_watches / max_user_instances)") from exc
    try:
        yield observer.is_alive
    finally:
        observer.stop()
        observer.join(timeout=5)
