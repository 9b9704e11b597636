"""The watcher: file system events in, published changes out, on the caller's thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shardfuse.pipeline.admin.publisher import Publisher, fails_alone, why_not_published
from shardfuse.pipeline.admin.watching.debouncer import Debouncer
from shardfuse.pipeline.admin.watching.events import FsEvent, touched
from shardfuse.pipeline.admin.watching.ledger import Ledger
from shardfuse.pipeline.admin.watching.resolution import Resolution, SourceTrees
from shardfuse.pipeline.core.errors import TransientError
from shardfuse.pipeline.core.events import Op, WriteEvent

_NAMED = 5  # a summary names the paths of a batch up to this many


@dataclass
class Published:
    """One batch: the events sent, and the paths left alone with the reason."""

    events: list[WriteEvent] = field(default_factory=list)
    not_published: dict[str, str] = field(default_factory=dict)

    @property
    def writes(self) -> int:
        return sum(1 for e in self.events if e.op is Op.WRITE)

    @property
    def deletes(self) -> int:
        return len(self.events) - self.writes

    def summary(self) -> str:
        """``published 3 writes, 1 delete: a.md, b.md, c.md, -old.md`` (the names when there are few)."""
        line = f"published {_count(self.writes, 'write')}, {_count(self.deletes, 'delete')}"
        if 0 < len(self.events) <= _NAMED:
            line += ": " + ", ".join(e.path if e.op is Op.WRITE else f"-{e.path}" for e in self.events)
        return line


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class Watcher:
    """Events go into a :class:`Debouncer`; settled paths are resolved against the :class:`Ledger` and their
    changes sent through ``publisher`` (the ledger records each event as it is sent), then ``flush`` publishes
    them (the sink's flush: it keeps what it could not publish). A :class:`TransientError` keeps everything:
    a failed flush is tried again first at the next call (the events are not made again), and paths whose
    changes were not all sent are put back, due at once, to be resolved again: nothing pending is lost,
    nothing is sent twice, and what is sent is what is on disk then.
    """

    def __init__(self, *, zone: str, trees: SourceTrees, ledger: Ledger, publisher: Publisher,
                 flush: Callable[[], None], settle_s: float, max_delay_s: float,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], int] = time.time_ns) -> None:
        self.zone = zone
        self.trees = trees
        self.ledger = ledger
        self._publisher = publisher
        self._flush = flush
        self._debouncer = Debouncer(settle_s=settle_s, max_delay_s=max_delay_s)
        self._unflushed: Published | None = None  # sent, but the flush that publishes them has not succeeded
        self._clock = clock
        self._wall = wall

    @property
    def pending(self) -> int:
        """Changes not published yet: paths waiting to settle (or to be resolved again) and events sent but
        not flushed."""
        return len(self._debouncer) + (len(self._unflushed.events) if self._unflushed else 0)

    def observe(self, event: FsEvent) -> None:
        now = self._clock()
        for item in touched(event):
            self._debouncer.add(item, now)

    def wake_in(self) -> float | None:
        """Seconds until the next path settles (0: a flush is owed); None when nothing is pending."""
        return 0.0 if self._unflushed is not None else self._debouncer.wake_in(self._clock())

    def publish_due(self, *, everything: bool = False) -> Published | None:
        """Publish what has settled (``everything``: all that is pending) and what an earlier call could not
        flush. None when there was nothing to do."""
        items = self._debouncer.drain() if everything else self._debouncer.due(self._clock())
        if items:
            batch = self._unflushed or Published()
            self._unflushed = batch
            try:
                self._send(self.trees.resolve(items, self.ledger), batch)
            except TransientError:
                self._debouncer.put_back(items, self._clock())
                raise
        if self._unflushed is None:
            return None
        self._flush()
        batch, self._unflushed = self._unflushed, None
        return batch

    def _send(self, resolution: Resolution, batch: Published) -> None:
        batch.not_published.update(resolution.unreadable)
        for change in resolution.changes:
            seq = self.ledger.seq_for(change.name, self._wall())
            try:
                if change.op is Op.DELETE:
                    event = self._publisher.delete(zone=self.zone, path=change.name, seq=seq)
                else:  # the file streamed into the CAS: the event names the bytes stored
                    assert change.file is not None  # a write's Change always names its file
                    event = self._publisher.write(zone=self.zone, path=change.name, data=change.file, seq=seq)
            except FileNotFoundError:  # gone since it was resolved: its own delete event follows
                continue
            except Exception as exc:
                # Unreadable now, a name no event can carry, a file that changed while it was stored: said, not
                # retried, and what the index holds is left alone. A store out of reach (TransientError) is
                # retried by the caller; one that is misconfigured stops the watch, as it would every file.
                if not fails_alone(exc):
                    raise
                batch.not_published[change.name] = why_not_published(exc)
                continue
            self.ledger.published(event)
            batch.events.append(event)
