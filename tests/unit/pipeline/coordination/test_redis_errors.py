"""Redis errors become ours where they arise (shardfuse.pipeline.coordination.redis_errors): the leases, the
heartbeat and the chunk registry, on a fakeredis server that is down and on a real client whose server is
not there. What the task layer sees is a StoreUnavailableError naming where Redis is, never the password."""

from __future__ import annotations

import socket
import time

import fakeredis
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shardfuse.pipeline.coordination.chunk_registry import RedisChunkRegistry
from shardfuse.pipeline.coordination.leases import DocumentLeases, Lease
from shardfuse.pipeline.coordination.liveness import Heartbeat, alive_key
from shardfuse.pipeline.coordination.redis_errors import redis_errors, redis_location
from shardfuse.pipeline.core.errors import StoreUnavailableError, TransientError


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def client(server: fakeredis.FakeServer) -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(server=server)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_leases_on_a_redis_that_is_down_raise_ours_and_release_never_raises(
    server: fakeredis.FakeServer, client: fakeredis.FakeRedis
) -> None:
    leases = DocumentLeases(client, holder="w1", ttl_s=60)
    lease = leases.acquire("z", "a.md")
    assert lease is not None
    server.connected = False
    for call in (lambda: leases.acquire("z", "b.md"), lambda: leases.holder_of("z", "a.md"),
                 lambda: leases.raise_floor(7)):
        with pytest.raises(StoreUnavailableError, match="document leases: Redis at .* is unreachable") as caught:
            call()
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
    assert leases.release(lease) is False  # logged; the lease is taken back at its next acquire
    server.connected = True
    assert leases.acquire("z", "a.md") is not None


def test_the_heartbeat_and_the_chunk_registry_raise_ours(server: fakeredis.FakeServer,
                                                        client: fakeredis.FakeRedis) -> None:
    heartbeat = Heartbeat(client, holder="w1", interval_s=1, dead_after_s=3)
    registry = RedisChunkRegistry(client)
    server.connected = False
    with pytest.raises(StoreUnavailableError, match="the heartbeat of w1"):
        heartbeat.beat()
    with pytest.raises(StoreUnavailableError, match="the chunk registry"):
        registry.repeated("z", "a.md", ["h1", "h2"])
    with pytest.raises(StoreUnavailableError, match="the chunk registry"):
        registry.forget("z")
    heartbeat.stop()  # never raises: the key expires on its own


def test_the_heartbeat_thread_outlives_an_outage(server: fakeredis.FakeServer,
                                                 client: fakeredis.FakeRedis) -> None:
    heartbeat = Heartbeat(client, holder="w1", interval_s=0.02, dead_after_s=5).start()
    try:
        server.connected = False
        time.sleep(0.1)  # several failed beats
        server.connected = True
        client.delete(alive_key("w1"))
        deadline = time.monotonic() + 5
        while not client.exists(alive_key("w1")) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.exists(alive_key("w1")), "the heartbeat stopped beating after the outage"
    finally:
        heartbeat.stop()


def test_a_refused_connection_names_host_port_and_db_but_not_the_password() -> None:
    port = _closed_port()
    client = redis.Redis.from_url(f"redis://:s3cret@127.0.0.1:{port}/2", socket_connect_timeout=2,
                                  retry=Retry(NoBackoff(), 0))
    with pytest.raises(StoreUnavailableError) as caught:
        DocumentLeases(client, holder="w1", ttl_s=60).acquire("z", "a.md")
    message = str(caught.value)
    assert f"Redis at 127.0.0.1:{port}/2 is unreachable" in message
    assert "s3cret" not in message
    assert isinstance(caught.value.__cause__, redis.ConnectionError)


def test_a_command_redis_refuses_is_transient_but_not_unreachable(client: fakeredis.FakeRedis) -> None:
    client.hset("shardfuse:chunks:z", "h", "a.md")
    client.set("shardfuse:chunks:z2", "not a hash")  # WRONGTYPE for HSETNX
    with pytest.raises(TransientError, match=r"the chunk registry: Redis at .* failed \(ResponseError") as caught:
        RedisChunkRegistry(client).repeated("z2", "a.md", ["h"])
    assert not isinstance(caught.value, StoreUnavailableError)
    assert isinstance(caught.value.__cause__, redis.ResponseError)


def test_errors_other_than_redis_pass_through_untouched(client: fakeredis.FakeRedis) -> None:
    with pytest.raises(KeyError), redis_errors(client, "anything"):
        raise KeyError("ours to see")


def test_locations_of_tcp_and_unix_socket_clients() -> None:
    assert redis_location(redis.Redis(host="10.0.0.5", port=6380, db=3, password="pw")) == "10.0.0.5:6380/3"
    assert redis_location(redis.Redis(unix_socket_path="/run/redis.sock")) == "unix:/run/redis.sock/0"
    assert redis_location(object()) == "an unknown address"


def test_a_released_lease_stays_released_when_redis_comes_back(server: fakeredis.FakeServer,
                                                               client: fakeredis.FakeRedis) -> None:
    first, second = DocumentLeases(client, holder="a", ttl_s=60), DocumentLeases(client, holder="b", ttl_s=60)
    client.set("shardfuse:alive:a", 1)
    lease = first.acquire("z", "p")
    assert isinstance(lease, Lease)
    server.connected = False
    with pytest.raises(StoreUnavailableError):
        second.acquire("z", "p")
    server.connected = True
    assert second.acquire("z", "p") is None  # a live holder still has it: nothing changed while Redis was down
