"""A watcher over a real temporary tree, with its clocks, sink and broker outages in the test's hands."""

from __future__ import annotations

from pathlib import Path

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.admin.watching.events import FsEvent, Kind
from shardfuse.pipeline.admin.watching.ledger import Ledger
from shardfuse.pipeline.admin.watching.resolution import SourceTrees
from shardfuse.pipeline.admin.watching.watcher import Published, Watcher
from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.storage.cas import ContentStore, InMemoryContentStore

SETTLE_S = 0.25


class HoldingSink:
    """Like the broker sink: events are held until ``flush``, which fails while ``outage`` is set (and keeps
    them)."""

    def __init__(self) -> None:
        self.held: list[WriteEvent] = []
        self.published: list[WriteEvent] = []
        self.outage = False
        self.failures_left = 0  # the next flushes that fail, then it is back

    def send(self, event: WriteEvent) -> None:
        self.held.append(event)

    def flush(self) -> None:
        if self.failures_left > 0:
            self.failures_left -= 1
            raise StoreUnavailableError("cannot publish to the broker at redis://127.0.0.1:1/0: connection refused")
        if self.outage:
            raise StoreUnavailableError("cannot publish to the broker at redis://127.0.0.1:1/0")
        self.published += self.held
        self.held = []


class Harness:
    def __init__(self, tmp_path: Path, *, ledger: Ledger | None = None, cas: ContentStore | None = None) -> None:
        self.base = tmp_path
        self.root = tmp_path / "docs"
        self.root.mkdir()
        self.now = 0.0
        self.ticking = False  # every read of the clock a second later (for the loop's own reads)
        self.wall = 1_000
        self.sink = HoldingSink()
        publisher = Publisher(cas=cas or InMemoryContentStore(), sink=self.sink)
        self.watcher = Watcher(zone="z", trees=SourceTrees([self.root], base=tmp_path), ledger=ledger or Ledger(),
                               publisher=publisher, flush=self.sink.flush, settle_s=SETTLE_S, max_delay_s=2.0,
                               clock=self._clock, wall=self._tick)

    def _clock(self) -> float:
        if self.ticking:
            self.now += 1.0
        return self.now

    def _tick(self) -> int:
        self.wall += 1
        return self.wall

    def path(self, rel: str) -> Path:
        return self.root / rel

    def write(self, rel: str, data: str, *, event: bool = True) -> None:
        """Write a file the way most programs do (created, modified, closed)."""
        path = self.path(rel)
        existed = path.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data)
        if event:
            if not existed:
                self.event(Kind.CREATED, rel)
            self.event(Kind.MODIFIED, rel)
            self.event(Kind.CLOSED, rel)

    def event(self, kind: Kind, rel: str, dest: str | None = None, *, is_directory: bool = False) -> None:
        self.watcher.observe(FsEvent(kind, self.path(rel), is_directory, self.path(dest) if dest else None))

    def settle(self) -> list[tuple[str, str]]:
        """Let everything settle and publish: the (op, document path) of each event sent."""
        self.now += 10 * SETTLE_S
        batch = self.watcher.publish_due()
        return _ops(batch)


def _ops(batch: Published | None) -> list[tuple[str, str]]:
    if batch is None:
        return []
    return [("write" if e.op is Op.WRITE else "delete", e.path) for e in batch.events]
