"""Document leases and fencing tokens (shardfuse.pipeline.coordination.leases) against fakeredis with Lua: who may work
on a
document, and how a holder that died or lapsed is replaced."""

from __future__ import annotations

import fakeredis
import pytest
import redis

from shardfuse.pipeline.coordination.leases import FENCE_KEY, Busy, DocumentLeases, Lease, lease_key
from shardfuse.pipeline.coordination.liveness import Heartbeat, alive_key


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def _worker(client: fakeredis.FakeRedis, name: str) -> DocumentLeases:
    client.set(alive_key(name), 1, px=60_000)  # as its heartbeat would
    return DocumentLeases(client, holder=name, ttl_s=900)


def test_a_live_holder_keeps_the_document_from_a_second_worker(client: fakeredis.FakeRedis) -> None:
    first, second = _worker(client, "a"), _worker(client, "b")
    lease = first.acquire("zone", "doc.md")
    assert lease is not None
    assert second.acquire("zone", "doc.md") is None
    assert second.holder_of("zone", "doc.md") == "a"
    # The holder itself cannot take it twice either: a second copy of a message in the same process waits.
    assert first.acquire("zone", "doc.md") is None
    # Other documents are free.
    assert second.acquire("zone", "other.md") is not None


def test_release_frees_the_document_and_tokens_only_grow(client: fakeredis.FakeRedis) -> None:
    first, second = _worker(client, "a"), _worker(client, "b")
    one = first.acquire("z", "p")
    assert one is not None and first.release(one)
    two = second.acquire("z", "p")
    assert two is not None and two.token > one.token


def test_a_dead_holders_lease_is_taken_over_at_once(client: fakeredis.FakeRedis) -> None:
    dead, live = _worker(client, "dead"), _worker(client, "live")
    old = dead.acquire("z", "p")
    assert old is not None
    client.delete(alive_key("dead"))  # its heartbeat expired
    new = live.acquire("z", "p")
    assert new is not None and new.token > old.token
    # The dead holder's late release must not free its successor's lease.
    assert not dead.release(old)
    assert live.holder_of("z", "p") == "live"


def test_an_expired_lease_is_free(client: fakeredis.FakeRedis) -> None:
    first = _worker(client, "a")
    assert first.acquire("z", "p") is not None
    client.delete(lease_key("z", "p"))  # as PEXPIRE would after lease_s
    assert _worker(client, "b").acquire("z", "p") is not None


def test_raise_floor_heals_a_counter_that_went_backwards(client: fakeredis.FakeRedis) -> None:
    leases = _worker(client, "a")
    client.set(FENCE_KEY, 3)  # say Redis lost the counter and a shard has seen token 41
    assert leases.raise_floor(41) == 41
    lease = leases.acquire("z", "p")
    assert lease is not None and lease.token == 42
    assert leases.raise_floor(7) == 42  # never lowers it


def test_lease_keys_take_any_zone_and_path() -> None:
    odd = lease_key("zone\x00", "a/\u202e/\udcff.txt")
    assert odd != lease_key("zone", "\x00a/\u202e/\udcff.txt")
    assert odd.startswith("shardfuse:lease:") and len(odd) == len("shardfuse:lease:") + 32


def test_heartbeat_marks_the_process_alive_until_it_stops(client: fakeredis.FakeRedis) -> None:
    beats: list[int] = []
    heart = Heartbeat(client, holder="h", interval_s=0.01, dead_after_s=5)
    heart.on_beat(lambda: beats.append(1))
    heart.start()
    try:
        assert client.exists(alive_key("h")) and not client.exists(alive_key("other"))
        assert 0 < client.pttl(alive_key("h")) <= 5000
    finally:
        heart.stop()
    assert not client.exists(alive_key("h"))


def test_heartbeat_refuses_an_expiry_shorter_than_its_interval(client: fakeredis.FakeRedis) -> None:
    with pytest.raises(ValueError, match="dead_after_s"):
        Heartbeat(client, holder="h", interval_s=5, dead_after_s=5)


def test_a_lease_whose_release_failed_is_taken_back_by_its_own_holder(
    client: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = _worker(client, "a")
    held = [leases.acquire("z", path) for path in ("p", "q")]
    assert held[0] is not None and held[1] is not None
    # The holder is working under it: a second copy of the message in the same process must wait.
    assert leases.acquire("z", "p") is None

    def unreachable(**_: object) -> int:
        raise redis.ConnectionError("Redis is restarting")

    with monkeypatch.context() as patch:  # the releases fail: the leases stay behind in Redis
        patch.setattr(leases, "_release", unreachable)
        # A failed release does not raise, so a caller releasing a message's leases reaches every one.
        assert [leases.release(lease) for lease in held] == [False, False]
    assert leases.holder_of("z", "p") == leases.holder_of("z", "q") == "a"
    for lease in held:  # not stuck behind its own leftovers for lease_s
        again = leases.acquire("z", lease.path)
        assert again is not None and again.token > lease.token
    assert _worker(client, "b").acquire("z", "p") is None  # another live worker still may not take it


def test_a_batch_of_documents_is_taken_in_one_round_trip_each_free_or_busy_on_its_own(
        client: fakeredis.FakeRedis) -> None:
    first, second = _worker(client, "a"), _worker(client, "b")
    assert second.acquire("z", "held.md") is not None
    taken = first.acquire_many([("z", "one.md"), ("z", "held.md"), ("z", "two.md"), ("z", "one.md")])
    one, held, two, again = taken
    assert isinstance(one, Lease) and isinstance(two, Lease) and two.token > one.token
    assert held == Busy(zone="z", path="held.md", holder="b")
    # A document named twice is taken once: the second mention waits, as a second acquire would.
    assert again == Busy(zone="z", path="one.md", holder="a")
    assert first.acquire_many([]) == []


def test_a_batch_is_given_back_in_one_round_trip_except_leases_no_longer_ours(client: fakeredis.FakeRedis) -> None:
    first, second = _worker(client, "a"), _worker(client, "b")
    leases = [lease for lease in first.acquire_many([("z", "p"), ("z", "q")]) if isinstance(lease, Lease)]
    client.delete(lease_key("z", "q"))  # lapsed, and taken by another worker
    assert second.acquire("z", "q") is not None
    assert first.release_many(leases) == 1
    assert second.holder_of("z", "p") is None and second.holder_of("z", "q") == "b"
    assert first.release_many([]) == 0
