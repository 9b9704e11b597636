"""Receiving with BLMOVE into a per-consumer inbox (shardfuse.workers.broker.transport,
shardfuse.workers.broker.inbox), against
a real redis-server: a consumer killed between taking a message and recording it leaves the message in
its inbox, where the reaper finds it; kombu's own transport loses it there."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.broker import inbox as broker_inbox
from shardfuse.workers.broker.inbox import INBOXES_KEY, UNREADABLE_KEY
from shardfuse.workers.broker.transport import TRANSPORT
from shardfuse.workers.status import collect_status, format_status
from tests.integration.conftest import REPO
from tests.support.socket_redis import loopback_redis

pytestmark = pytest.mark.integration

QUEUE = "inbox-test"
OPTIONS = {"priority_steps": [0]}

# A consumer that dies (os._exit, as kill -9 would) at the instant after the broker handed it a message and
# before it recorded the message anywhere: the window kombu's BRPOP leaves open.
_DIES_ON_RECEIPT = """
import os, sys
from kombu import Connection, Queue
from kombu.transport import redis as kombu_redis
from shardfuse.workers.broker import transport as broker_transport

def die(self, message, delivery_tag):
    print("received", flush=True)
    os._exit(0)

broker_transport.QoS.append = die
kombu_redis.QoS.append = die
transport = sys.argv[2]
with Connection(sys.argv[1], transport=None if transport == "kombu" else transport,
                transport_options={"priority_steps": [0]}) as conn:
    queue = Queue(sys.argv[3], routing_key=sys.argv[3])
    with conn.Consumer(queue, accept=["json"], callbacks=[lambda body, message: None]):
        print("ready", flush=True)
        while True:
            conn.drain_events(timeout=60)
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with loopback_redis(tmp_path_factory.mktemp("inbox-redis")) as port:
        yield f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def client(url: str) -> redis.Redis:
    client = redis.Redis.from_url(url)
    client.flushall()
    return client


def _publish(url: str, *bodies: dict[str, int]) -> None:
    with Connection(url, transport=TRANSPORT, transport_options=OPTIONS) as conn:
        producer = Producer(conn.channel(), exchange=Exchange(""), serializer="json")
        for body in bodies:
            producer.publish(body, routing_key=QUEUE, declare=[Queue(QUEUE, routing_key=QUEUE)])


@contextlib.contextmanager
def _consumer(url: str, received: list[object]) -> Iterator[Connection]:
    with Connection(url, transport=TRANSPORT, transport_options=OPTIONS) as conn:
        queue = Queue(QUEUE, routing_key=QUEUE)
        with conn.Consumer(queue, accept=["json"], callbacks=[lambda body, message: received.append(message)]):
            yield conn


def _drain(conn: Connection, received: list[object], count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while len(received) < count and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError, OSError):
            conn.drain_events(timeout=0.5)
    assert len(received) >= count, f"received {len(received)} of {count}"


def _inboxes(client: redis.Redis) -> list[str]:
    return sorted(k.decode() for k in client.scan_iter(broker_inbox.INBOX_PREFIX + "*"))


def test_a_received_message_is_in_unacked_and_not_in_the_inbox_until_acknowledged(
        url: str, client: redis.Redis) -> None:
    _publish(url, {"n": 1})
    received: list[object] = []
    with _consumer(url, received) as conn:
        _drain(conn, received, 1)
        message = received[0]
        assert json.loads(message.body) == {"n": 1}  # type: ignore[attr-defined]
        assert client.hexists("unacked", message.delivery_tag)  # type: ignore[attr-defined]
        assert client.llen(QUEUE) == 0 and all(client.llen(k) == 0 for k in _inboxes(client))
        registered = {json.loads(v)["queue"] for v in client.hvals(INBOXES_KEY)}
        assert registered == {QUEUE}
        message.ack()  # type: ignore[attr-defined]
        assert not client.hexists("unacked", message.delivery_tag)  # type: ignore[attr-defined]
    assert client.hlen(INBOXES_KEY) == 0  # a clean close forgets its inbox


@pytest.mark.parametrize("transport", [TRANSPORT, "kombu"])
def test_a_consumer_killed_on_receipt_leaves_the_message_where_the_reaper_finds_it(
        url: str, client: redis.Redis, transport: str) -> None:
    consumer = subprocess.Popen([sys.executable, "-c", _DIES_ON_RECEIPT, url, transport, QUEUE], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert consumer.stdout is not None and consumer.stdout.readline().strip() == "ready"
        _publish(url, {"n": 7})
        assert consumer.stdout.readline().strip() == "received"
        consumer.wait(timeout=30)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    assert client.llen(QUEUE) == 0 and client.hlen("unacked") == 0
    if transport == "kombu":  # BRPOP took it and nobody recorded it: it is gone (what we fix)
        assert not _inboxes(client)
        return
    [inbox] = _inboxes(client)
    assert client.llen(inbox) == 1
    # The dead consumer never beat: once its registration is older than the grace, the reaper puts it back.
    assert broker_inbox.release_dead_inboxes(client, grace_s=60) == 0
    assert broker_inbox.release_dead_inboxes(client, grace_s=60, now=time.time() + 61) == 1
    assert client.llen(inbox) == 0 and client.hlen(INBOXES_KEY) == 0
    received: list[object] = []
    with _consumer(url, received) as conn:
        _drain(conn, received, 1)
        assert json.loads(received[0].body) == {"n": 7}  # type: ignore[attr-defined]
        received[0].ack()  # type: ignore[attr-defined]


def test_a_live_consumers_inbox_is_left_alone(url: str, client: redis.Redis) -> None:
    holder = "consumer@host:1:abc"
    inbox = broker_inbox.inbox_key(holder, QUEUE)
    client.lpush(inbox, b"{}")
    broker_inbox.register(client, inbox=inbox, holder=holder, queue=QUEUE, now=time.time() - 3600)
    client.set(broker_inbox.alive_key(holder), 1, px=60_000)
    assert broker_inbox.release_dead_inboxes(client, grace_s=60) == 0
    assert client.llen(inbox) == 1
    client.delete(broker_inbox.alive_key(holder))
    assert broker_inbox.release_dead_inboxes(client, grace_s=60) == 1
    assert client.lrange(QUEUE, 0, -1) == [b"{}"]


def test_a_delivery_cut_off_by_a_broken_connection_is_put_back_before_the_next_receive(
        url: str, client: redis.Redis) -> None:
    received: list[object] = []
    with _consumer(url, received) as conn:
        with contextlib.suppress(TimeoutError, OSError):
            conn.drain_events(timeout=0.3)  # nothing yet: a BLMOVE stays pending on the server
        [registered] = [k.decode() for k in client.hkeys(INBOXES_KEY)]
        _publish(url, {"n": 3})
        # The pending BLMOVE moves it into the inbox; the connection then breaks before the reply is read.
        assert client.llen(registered) == 1 and client.llen(QUEUE) == 0
        conn.default_channel.client.connection.disconnect()
        _drain(conn, received, 1)
        assert json.loads(received[0].body) == {"n": 3}  # type: ignore[attr-defined]
        assert client.llen(registered) == 0
        received[0].ack()  # type: ignore[attr-defined]


def _set_aside(client: redis.Redis) -> list[dict[str, object]]:
    """The records in shardfuse:unreadable, oldest first, each with its item's bytes decoded."""
    records = [json.loads(raw) for raw in reversed(client.lrange(UNREADABLE_KEY, 0, -1))]
    return [{**record, "message": base64.b64decode(record["message"])} for record in records]


def test_an_unreadable_message_is_kept_aside_and_the_next_one_delivered(url: str, client: redis.Redis) -> None:
    client.lpush(QUEUE, b"\xff not json")
    _publish(url, {"n": 2})
    received: list[object] = []
    with _consumer(url, received) as conn:
        _drain(conn, received, 1)
        assert json.loads(received[0].body) == {"n": 2}  # type: ignore[attr-defined]
        received[0].ack()  # type: ignore[attr-defined]
    [record] = _set_aside(client)
    assert record["message"] == b"\xff not json" and record["queue"] == QUEUE
    assert "not UTF-8" in str(record["reason"])
    assert all(client.llen(k) == 0 for k in _inboxes(client))
    status = collect_status(Settings(broker={"url": url}), state=None)  # no database here: reported as such
    assert status["unreadable_messages"] == 1
    shown = format_status(status)
    assert f"1 message(s) no worker could run, set aside in Redis list {UNREADABLE_KEY}" in shown
    assert f"unread   [{QUEUE}] 10 bytes: the message is not UTF-8" in shown


# The reproductions: an incomplete envelope (KeyError inside kombu: a reconnect loop) and deep
# nesting (RecursionError: a dead worker at every start).
HOSTILE = [b"", b'{"body": "e30=", "headers": {}}', b"[" * 50_000 + b"]" * 50_000, b'{"body": "e30="',
           json.dumps({"body": "e30=", "content-type": "application/json", "content-encoding": "utf-8",
                       "headers": {"compression": "application/x-gzip"},
                       "properties": {"body_encoding": "base64",
                                      "delivery_info": {"exchange": "", "routing_key": QUEUE}}}).encode()]


def test_hostile_items_are_set_aside_with_their_reasons_and_the_good_one_behind_them_delivered(
        url: str, client: redis.Redis) -> None:
    for item in HOSTILE:
        client.lpush(QUEUE, item)
    _publish(url, {"n": 4})
    received: list[object] = []
    with _consumer(url, received) as conn:
        channel = conn.default_channel
        _drain(conn, received, 1)  # no exception out of the receive: no reconnect
        assert conn.default_channel is channel
        assert json.loads(received[0].body) == {"n": 4}  # type: ignore[attr-defined]
        received[0].ack()  # type: ignore[attr-defined]
    records = _set_aside(client)
    assert [r["message"] for r in records] == HOSTILE
    assert [str(r["reason"]).split(" (")[0] for r in records] == [
        "the message is empty", "the message has no 'content-type'", "the message nests deeper than 64 levels",
        "the message is truncated JSON", "header 'compression' is not one a task message carries"]
    assert client.llen(QUEUE) == 0 and client.hlen("unacked") == 0


def test_a_consumer_of_several_queues_sets_hostile_items_aside_too(url: str, client: redis.Redis) -> None:
    other = f"{QUEUE}-2"
    client.lpush(other, HOSTILE[1])
    _publish(url, {"n": 5})
    received: list[object] = []
    with Connection(url, transport=TRANSPORT, transport_options=OPTIONS) as conn:
        queues = [Queue(QUEUE, routing_key=QUEUE), Queue(other, routing_key=other)]
        with conn.Consumer(queues, accept=["json"], callbacks=[lambda body, message: received.append(message)]):
            assert conn.default_channel._atomic_queue() is None  # kombu's BRPOP receive
            _drain(conn, received, 1)
            deadline = time.monotonic() + 5
            while client.llen(other) and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError, OSError):
                    conn.drain_events(timeout=0.2)
        received[0].ack()  # type: ignore[attr-defined]
    [record] = _set_aside(client)
    assert record["queue"] == other and record["message"] == HOSTILE[1]


def test_a_message_whose_delivery_fails_is_set_aside_not_looped(url: str, client: redis.Redis) -> None:
    _publish(url, {"n": "refused"}, {"n": 6})
    received: list[object] = []

    def callback(body: object, message: object) -> None:
        if json.loads(message.body) == {"n": "refused"}:  # type: ignore[attr-defined]
            raise KeyError("the consumer cannot take it")  # kombu would count this as a connection error
        received.append(message)

    with Connection(url, transport=TRANSPORT, transport_options=OPTIONS) as conn, \
            conn.Consumer(Queue(QUEUE, routing_key=QUEUE), accept=["json"], callbacks=[callback]):
        _drain(conn, received, 1)
        assert client.hlen("unacked") == 1  # only the good one: the refused one left unacked with its record
        received[0].ack()  # type: ignore[attr-defined]
    [record] = _set_aside(client)
    assert "refused on delivery: KeyError" in str(record["reason"])
    assert json.loads(base64.b64decode(json.loads(record["message"])["body"])) == {"n": "refused"}


def test_a_copied_delivery_tag_cannot_overwrite_another_messages_record(url: str, client: redis.Redis) -> None:
    _publish(url, {"n": 7})
    [item] = client.lrange(QUEUE, 0, -1)
    _publish(url, {"n": 8})
    client.lpush(QUEUE, item)  # a second copy of the first, with its delivery tag
    received: list[object] = []
    with _consumer(url, received) as conn:
        _drain(conn, received, 3)
        tags = {message.delivery_tag for message in received}  # type: ignore[attr-defined]
        assert len(tags) == 3 and client.hlen("unacked") == 3  # three records: none overwritten
        for message in received:
            message.ack()  # type: ignore[attr-defined]
    assert client.hlen("unacked") == 0
