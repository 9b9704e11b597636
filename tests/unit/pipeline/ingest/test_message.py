"""A message of write events through the ingest stage (shardfuse.pipeline.ingest.message): per-event
outcomes, the documents for the embed stage, the shards whose BM25 update is due, each event under its
document's lease (the real leases, on fakeredis)."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import fakeredis
import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.leases import DocumentLeases
from shardfuse.pipeline.coordination.liveness import alive_key
from shardfuse.pipeline.core.errors import DocumentBusyError, InvalidEventError, LeaseLostError, StoreUnavailableError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.index.store import ApplyOutcome, DocumentChange
from shardfuse.pipeline.ingest.message import IngestPorts, ingest_message
from shardfuse.pipeline.storage.cas import InMemoryContentStore

SHARDS = 3
SETTINGS = Settings(shards=SHARDS, chunking={"max_tokens": 32, "overlap_tokens": 4})


class FakeShard:
    """Applies the version rule and the fencing rule the real store applies, and can be down for the
    message's early (batched) version check."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.seqs: dict[tuple[str, str], int] = {}
        self.fences: dict[tuple[str, str], int] = {}
        self.batched_check_down = False

    def document_seq(self, zone: str, path: str) -> int | None:
        return self.seqs.get((zone, path))

    def document_seqs(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        if self.batched_check_down:
            raise StoreUnavailableError("cannot reach PostgreSQL")
        return {k: self.seqs[k] for k in keys if k in self.seqs}

    def apply(self, changes: Sequence[DocumentChange]) -> list[ApplyOutcome]:
        (change,) = changes
        held, fence = self.seqs.get(change.key), self.fences.get(change.key, 0)
        if change.fence is not None and change.fence < fence:
            return [ApplyOutcome(change.key, change.event.seq, False, held, fenced=True, stored_fence=fence)]
        fresh = held is None or change.event.seq > held
        if fresh:
            self.seqs[change.key] = change.event.seq
            self.fences[change.key] = max(fence, change.fence or 0)
        return [ApplyOutcome(change.key, change.event.seq, fresh, held)]


@pytest.fixture
def redis_client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def _leases(client: fakeredis.FakeRedis, holder: str) -> DocumentLeases:
    client.set(alive_key(holder), 1, px=60_000)  # as its heartbeat would
    return DocumentLeases(client, holder=holder, ttl_s=900)


@pytest.fixture
def ports(redis_client: fakeredis.FakeRedis) -> IngestPorts:
    return IngestPorts(settings=SETTINGS, cas=InMemoryContentStore(), stores=[FakeShard(i) for i in range(SHARDS)],
                       counter=TokenCounter(), leases=_leases(redis_client, "this-worker"))


def _write(ports: IngestPorts, path: str, text: str = "some words to index", *, seq: int = 1) -> dict[str, Any]:
    cas = ports.cas
    assert isinstance(cas, InMemoryContentStore)
    data = text.encode()
    return WriteEvent(op=Op.WRITE, zone="z", path=path, content_hash=cas.put(data), size=len(data),
                      seq=seq).model_dump(mode="json")


def _delete(path: str, *, seq: int) -> dict[str, Any]:
    return WriteEvent(op=Op.DELETE, zone="z", path=path, seq=seq).model_dump(mode="json")


def _shard(ports: IngestPorts, path: str) -> FakeShard:
    store = ports.stores[shard_for("z", path, SHARDS)]
    assert isinstance(store, FakeShard)
    return store


def test_a_message_yields_documents_in_order_and_the_shards_of_its_deletes_and_skips(ports: IngestPorts) -> None:
    paths = [f"doc{i}.txt" for i in range(6)]
    events = [_write(ports, path) for path in paths] + [_delete("gone.txt", seq=3), _write(ports, "blank.txt", "   ")]
    done = ingest_message(events, ports=ports)
    assert done.failures == ()
    assert [d.event.path for d in done.documents] == paths  # as the publisher grouped them, for one embed message
    assert done.counts == {"prepared": 6, "deleted": 1, "skipped": 1}
    # Deletes and skips need no embedding: their BM25 update is due now, on their own shards only.
    expected: dict[int, tuple[tuple[str, str], ...]] = {}
    for path in ("gone.txt", "blank.txt"):
        shard = shard_for("z", path, SHARDS)
        expected[shard] = (*expected.get(shard, ()), ("z", path))
    assert {shard: set(keys) for shard, keys in done.unchanged.items()} == {
        shard: set(keys) for shard, keys in expected.items()}


def test_a_malformed_event_fails_alone(ports: IngestPorts) -> None:
    good = _write(ports, "a.txt")
    bad = {**_write(ports, "b.txt"), "content_hash": "md5:nope"}
    done = ingest_message([bad, good, "not an event"], ports=ports)
    assert [d.event.path for d in done.documents] == ["a.txt"]
    assert [raw for raw, _ in done.failures] == [bad, "not an event"]
    assert all(isinstance(error, InvalidEventError) for _, error in done.failures)


def test_the_events_of_one_document_are_applied_in_message_order(ports: IngestPorts) -> None:
    events = [_delete("a.txt", seq=1), _write(ports, "a.txt", "  ", seq=2), _delete("a.txt", seq=3)]
    done = ingest_message(events + [_write(ports, f"other{i}.txt") for i in range(4)], ports=ports)
    assert done.failures == ()
    # In any other order a newer tombstone or skip would make an older one stale.
    assert done.counts == {"deleted": 2, "skipped": 1, "prepared": 4}
    assert _shard(ports, "a.txt").seqs[("z", "a.txt")] == 3


def test_a_document_another_live_worker_holds_is_busy_and_the_others_go_on(
    ports: IngestPorts, redis_client: fakeredis.FakeRedis
) -> None:
    other = _leases(redis_client, "other-worker")
    assert other.acquire("z", "held.txt") is not None
    held = _write(ports, "held.txt")
    done = ingest_message([held, _write(ports, "free.txt")], ports=ports)
    assert [d.event.path for d in done.documents] == ["free.txt"]
    ((raw, error),) = done.failures
    assert raw == held and isinstance(error, DocumentBusyError) and "other-worker" in str(error)


def test_leases_are_given_back_after_the_message(ports: IngestPorts, redis_client: fakeredis.FakeRedis) -> None:
    ingest_message([_write(ports, "a.txt"), _delete("b.txt", seq=1)], ports=ports)
    other = _leases(redis_client, "other-worker")
    assert other.acquire("z", "a.txt") is not None and other.acquire("z", "b.txt") is not None


def test_a_fenced_write_fails_its_event_and_the_next_lease_outranks_the_shards_token(ports: IngestPorts) -> None:
    shard = _shard(ports, "a.txt")
    shard.fences[("z", "a.txt")] = 1000  # a newer holder wrote under token 1000 while ours lapsed
    done = ingest_message([_delete("a.txt", seq=5)], ports=ports)
    ((_, error),) = done.failures
    assert isinstance(error, LeaseLostError) and error.stored_fence == 1000
    lease = ports.leases.acquire("z", "a.txt")
    assert lease is not None and lease.token > 1000


def test_after_a_fenced_event_the_documents_next_event_in_the_message_takes_a_new_lease(ports: IngestPorts) -> None:
    _shard(ports, "a.txt").fences[("z", "a.txt")] = 1000
    done = ingest_message([_delete("a.txt", seq=5), _delete("a.txt", seq=6)], ports=ports)
    ((_, error),) = done.failures
    assert isinstance(error, LeaseLostError)
    assert done.counts == {"deleted": 1}
    assert _shard(ports, "a.txt").seqs[("z", "a.txt")] == 6


class CountingRedis(fakeredis.FakeRedis):
    """Counts the Lua scripts run (each one round trip)."""

    scripts = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args and str(args[0]).upper() in ("EVALSHA", "EVAL"):
            CountingRedis.scripts += 1
        return super().execute_command(*args, **options)


def test_a_messages_leases_are_taken_in_one_round_trip_and_given_back_in_one() -> None:
    client = CountingRedis()
    ports = IngestPorts(settings=SETTINGS, cas=InMemoryContentStore(), stores=[FakeShard(i) for i in range(SHARDS)],
                        counter=TokenCounter(), leases=_leases(client, "this-worker"))
    ingest_message([_write(ports, "first.txt")], ports=ports)  # loads the scripts into Redis
    events = [_write(ports, f"doc{i}.txt") for i in range(6)] + [_delete("gone.txt", seq=1)]
    CountingRedis.scripts = 0
    done = ingest_message(events, ports=ports)
    assert done.failures == () and done.counts == {"prepared": 6, "deleted": 1}
    assert CountingRedis.scripts == 2
    assert not client.keys("shardfuse:lease:*")


def test_without_the_batched_version_check_each_event_asks_its_shard(ports: IngestPorts) -> None:
    for store in ports.stores:
        assert isinstance(store, FakeShard)
        store.batched_check_down = True
    _shard(ports, "old.txt").seqs[("z", "old.txt")] = 7
    done = ingest_message([_write(ports, "old.txt", seq=7), _write(ports, "new.txt", seq=1)], ports=ports)
    assert done.failures == ()
    assert done.counts == {"stale": 1, "prepared": 1}


def test_documents_are_worked_on_together_and_in_the_callers_context(ports: IngestPorts) -> None:
    task_id: contextvars.ContextVar[str] = contextvars.ContextVar("task_id", default="none")
    task_id.set("task-7")
    # Two events can only get past this barrier if two documents are worked on at once.
    together = threading.Barrier(2, timeout=10)
    seen: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def around(event: WriteEvent) -> Iterator[None]:
        seen.append((event.path, task_id.get()))
        together.wait()
        yield

    done = ingest_message([_write(ports, "a.txt"), _write(ports, "b.txt")], ports=ports, around=around, threads=2)
    assert done.failures == ()
    assert sorted(seen) == [("a.txt", "task-7"), ("b.txt", "task-7")]
