"""``Publisher.write_many``: contents stored on threads, events sent in order, each after its content."""

from __future__ import annotations

import threading
import time

import pytest

from shardfuse.pipeline.admin.publisher import Publisher, Write
from shardfuse.pipeline.core.events import WriteEvent
from shardfuse.pipeline.storage.cas import InMemoryContentStore


class SlowCas(InMemoryContentStore):
    """Stores the first content last (it sleeps), and records which threads stored contents."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()

    def put(self, data: bytes) -> str:
        self.threads.add(threading.current_thread().name)
        if data.endswith(b" 0"):
            time.sleep(0.05)
        return super().put(data)


class CheckingSink:
    def __init__(self, cas: InMemoryContentStore) -> None:
        self.cas = cas
        self.events: list[WriteEvent] = []

    def send(self, event: WriteEvent) -> None:
        assert event.content_hash is not None and self.cas.exists(event.content_hash)
        self.events.append(event)


def test_write_many_sends_every_event_in_order_after_its_content() -> None:
    cas = SlowCas()
    sink = CheckingSink(cas)
    clock = iter(range(1000, 2000)).__next__
    publisher = Publisher(cas=cas, sink=sink, clock=clock)
    writes = [Write(zone="z", path=f"d/{i}.md", data=f"document {i}".encode(), metadata={"i": i} if i == 3 else None)
              for i in range(50)]
    events = publisher.write_many(writes, threads=4)
    assert [e.path for e in sink.events] == [f"d/{i}.md" for i in range(50)] == [e.path for e in events]
    assert [e.seq for e in events] == sorted(e.seq for e in events)  # seq in publish order
    assert all(cas.get(e.content_hash or "") == f"document {i}".encode() for i, e in enumerate(events))
    assert events[3].metadata == {"i": 3} and events[0].mime == "text/markdown"
    assert len(cas.threads) > 1 and all(name.startswith("cas-put") for name in cas.threads)
    assert publisher.write_many([Write(zone="z", path="p", data=b"x", seq=7)])[0].seq == 7


def test_write_many_stops_at_a_failed_content_having_sent_the_ones_before() -> None:
    class FailingCas(InMemoryContentStore):
        def put(self, data: bytes) -> str:
            if data == b"bad":
                raise OSError("disk full")
            return super().put(data)

    cas = FailingCas()
    sink = CheckingSink(cas)
    publisher = Publisher(cas=cas, sink=sink)
    writes = [Write(zone="z", path="a", data=b"a"), Write(zone="z", path="b", data=b"bad"),
              Write(zone="z", path="c", data=b"c")]
    with pytest.raises(OSError, match="disk full"):
        publisher.write_many(writes, threads=2)
    assert [e.path for e in sink.events] == ["a"]
