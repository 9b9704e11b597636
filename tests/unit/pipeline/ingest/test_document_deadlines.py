"""Per-document deadlines inside a message (shardfuse.pipeline.core.deadline, pipeline/ingest/message.py and
document_threads.py): a document that overruns fails alone with DeadlineExceededError while its siblings
complete, a thread that never comes back is given up on, and a redelivered copy of an applied event repeats
its BM25 bookkeeping."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import fakeredis
import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.leases import lease_key
from shardfuse.pipeline.core import deadline as deadlines
from shardfuse.pipeline.core.deadline import Deadline, call_within, checkpoint, running_within
from shardfuse.pipeline.core.errors import DeadlineExceededError, DocumentStuckError
from shardfuse.pipeline.core.events import WriteEvent
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.index.store import ApplyOutcome, DocumentChange
from shardfuse.pipeline.ingest.document_threads import Done, run_groups
from shardfuse.pipeline.ingest.message import IngestPorts, ingest_message
from shardfuse.pipeline.ingest.stage import IngestOutcome, IngestResult
from shardfuse.pipeline.storage.cas import InMemoryContentStore
from tests.unit.pipeline.ingest.test_message import SHARDS, FakeShard, _delete, _leases, _write

# Far above a small document's milliseconds, even on a loaded machine (make test runs two workers and the fault
# tests beside this): at 0.5 s a healthy sibling overran it once.
DEADLINE_S = 1.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class StuckCas(InMemoryContentStore):
    """A CAS whose reads of some content never return until released (a hung filesystem)."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck: set[str] = set()
        self.release = threading.Event()

    def get(self, content_hash: str) -> bytes:
        if content_hash in self.stuck:
            self.release.wait(30)
        return super().get(content_hash)


@pytest.fixture
def cas() -> Iterator[StuckCas]:
    store = StuckCas()
    yield store
    store.release.set()  # lets abandoned reads finish


def _ports(cas: StuckCas, deadline_s: float = DEADLINE_S) -> IngestPorts:
    settings = Settings(shards=SHARDS, chunking={"max_tokens": 32, "overlap_tokens": 4},
                        ingest={"document_deadline_s": deadline_s})
    counter = TokenCounter()
    counter.encode_with_offsets("warm up")  # its token-length table is built on first use: not inside a deadline
    return IngestPorts(settings=settings, cas=cas, stores=[FakeShard(i) for i in range(SHARDS)],
                       counter=counter, leases=_leases(fakeredis.FakeRedis(), "this-worker"))


def test_a_deadline_runs_out_on_its_clock_and_says_what_overran() -> None:
    clock = FakeClock()
    deadline = Deadline(2.0, what="[z] big.md", clock=clock)
    with running_within(deadline):
        checkpoint("chunking")  # in time: nothing happens
        assert deadlines.current() is deadline and deadline.timeout_s(30, "x") == 2.0
        clock.now += 2.5
        with pytest.raises(DeadlineExceededError, match=r"\[z\] big.md ran past its 2s deadline .* while chunking"):
            checkpoint("chunking")
        with pytest.raises(DeadlineExceededError):
            deadline.timeout_s(30, "asking the model")
    assert deadlines.current() is None
    checkpoint("chunking")  # without a deadline there is nothing to run past


def test_a_blocking_call_is_waited_for_no_longer_than_the_deadline_leaves() -> None:
    never = threading.Event()
    with running_within(Deadline(0.2)):
        assert call_within(lambda: 42, "reading") == 42
        with pytest.raises(ValueError, match="its own error"):
            call_within(lambda: (_ for _ in ()).throw(ValueError("its own error")), "reading")
        began = time.monotonic()
        with pytest.raises(DocumentStuckError, match="still reading its content"):
            call_within(lambda: never.wait(30), "reading its content")
        assert time.monotonic() - began < 5  # not the 30 s the call would have taken
    never.set()


def test_a_document_stuck_in_its_cas_read_fails_alone_and_its_siblings_complete(cas: StuckCas) -> None:
    ports = _ports(cas)
    events = [_write(ports, f"doc{i}.txt", f"document {i} has words to index") for i in range(5)]
    stuck = WriteEvent.model_validate(events[2])
    assert stuck.content_hash is not None
    cas.stuck.add(stuck.content_hash)
    done = ingest_message(events, ports=ports)
    assert [d.event.path for d in done.documents] == ["doc0.txt", "doc1.txt", "doc3.txt", "doc4.txt"]
    ((raw, error),) = done.failures
    assert raw == events[2] and isinstance(error, DocumentStuckError)  # the store's fault: retried
    assert "[z] doc2.txt" in str(error)
    assert "reading its content from the CAS" in str(error)


def test_a_thread_that_never_comes_back_is_given_up_on_and_its_late_result_dropped() -> None:
    release = threading.Event()
    finished: list[str] = []

    def one(group: list[tuple[Any, WriteEvent]]) -> list[Done]:
        (raw, event), = group
        if event.path == "stuck.txt":  # a call no deadline check reaches
            release.wait(30)
        finished.append(event.path)
        return [(raw, event, IngestOutcome(IngestResult.SKIPPED, 0))]

    groups = [[(p, WriteEvent(op="delete", zone="z", path=p, seq=1))] for p in ("a.txt", "stuck.txt", "b.txt")]
    began = time.monotonic()
    done = run_groups(groups, one, threads=2, deadline_s=0.2, grace_s=0.1)
    assert time.monotonic() - began < 5
    assert [raw for raw, _, _ in done] == ["a.txt", "stuck.txt", "b.txt"]
    assert isinstance(done[1][2], DocumentStuckError) and "given up on" in str(done[1][2])
    assert all(isinstance(outcome, IngestOutcome) for _, _, outcome in (done[0], done[2]))
    release.set()
    for _ in range(100):  # the abandoned thread finishes later; what it returns goes nowhere
        if "stuck.txt" in finished:
            break
        time.sleep(0.02)
    assert "stuck.txt" in finished and len(done) == 3


def test_a_group_that_raises_past_its_thread_fails_each_of_its_events() -> None:
    def one(group: list[tuple[Any, WriteEvent]]) -> list[Done]:
        raise KeyboardInterrupt  # a BaseException no event catches

    groups = [[(p, WriteEvent(op="delete", zone="z", path=p, seq=1))] for p in ("a.txt", "b.txt")]
    done = run_groups(groups, one, threads=4, deadline_s=1.0)
    assert [type(outcome) for _, _, outcome in done] == [KeyboardInterrupt, KeyboardInterrupt]


def test_a_redelivered_copy_of_an_applied_event_repeats_its_bm25_bookkeeping(cas: StuckCas) -> None:
    # The first run committed the document (the shard holds its seq) and died before scheduling its BM25
    # update: the copy finds it stale, and still lists it for the update.
    ports = _ports(cas, deadline_s=30)
    event = _write(ports, "applied.txt", seq=4)
    shard = shard_for("z", "applied.txt", SHARDS)
    store = ports.stores[shard]
    assert isinstance(store, FakeShard)
    store.seqs[("z", "applied.txt")] = 4
    done = ingest_message([event], ports=ports)
    assert done.counts == {"stale": 1} and done.documents == ()
    assert done.unchanged == {shard: (("z", "applied.txt"),)}


class BlockedShard(FakeShard):
    """A shard whose writes of one document block until released (a lock no deadline check reaches)."""

    def __init__(self, shard: int, blocked: str, release: threading.Event) -> None:
        super().__init__(shard)
        self.blocked, self.release = blocked, release

    def apply(self, changes: Sequence[DocumentChange]) -> list[ApplyOutcome]:
        if any(change.event.path == self.blocked for change in changes):
            self.release.wait(30)
        return super().apply(changes)


def test_a_document_given_up_on_keeps_its_lease_until_its_work_returns(cas: StuckCas) -> None:
    release = threading.Event()
    client = fakeredis.FakeRedis()
    settings = Settings(shards=SHARDS, ingest={"document_deadline_s": 0.2})
    stores = [BlockedShard(i, "stuck.txt", release) for i in range(SHARDS)]
    ports = IngestPorts(settings=settings, cas=cas, stores=stores, counter=TokenCounter(),
                        leases=_leases(client, "this-worker"))
    try:
        done = ingest_message([_delete("stuck.txt", seq=1), _delete("done.txt", seq=1)], ports=ports)
        ((_, error),) = done.failures
        assert isinstance(error, DocumentStuckError) and done.counts == {"deleted": 1}
        # Its thread may still write: no other run of the document may start meanwhile.
        other = _leases(client, "other-worker")
        assert other.acquire("z", "stuck.txt") is None and other.acquire("z", "done.txt") is not None
    finally:
        release.set()
    for _ in range(250):  # once its work returns, its thread gives the lease back
        if client.hget(lease_key("z", "stuck.txt"), "holder") is None:
            break
        time.sleep(0.02)
    assert other.acquire("z", "stuck.txt") is not None
