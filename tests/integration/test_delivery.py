"""At-least-once delivery against the session's real stack: document leases keep a second worker off a
document, a dead holder's lease is taken over, and messages a vanished consumer took are put back on their
queue by a live worker's heartbeat (shardfuse.workers.broker.redelivery) instead of waiting for visibility_timeout."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psycopg
import pytest

from shardfuse.pipeline.coordination.leases import DocumentLeases
from shardfuse.pipeline.coordination.liveness import alive_key
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardPools
from shardfuse.workers import monitor
from shardfuse.workers.app import create_app
from shardfuse.workers.monitor import LostRebuilds
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.status import collect_status, format_status
from tests.integration.conftest import REPO, Stack
from tests.support.polling import eventually

pytestmark = pytest.mark.integration

# A consumer that takes one message from the ingest queue and dies holding it: no ack, no channel close
# (a clean close would hand the message back; os._exit is what kill -9 leaves behind).
_VANISHING_CONSUMER = """
import os
from shardfuse.pipeline.config.settings import load_settings
from shardfuse.workers.app import create_app
from shardfuse.workers.monitor import LostRebuilds
from shardfuse.workers.stack.layout import StackLayout

app = create_app(load_settings())
conn = app.connection_for_read()
taken = []
consumer = conn.Consumer(app.amqp.queues["ingest"], accept=["json"], callbacks=[lambda body, m: taken.append(m)])
consumer.qos(prefetch_count=1)
consumer.consume()
print("ready", flush=True)
while not taken:
    conn.drain_events(timeout=120)
print(taken[0].delivery_tag, flush=True)
os._exit(0)
"""


def _indexed(stack: Stack, zone: str, path: str) -> tuple[int, str] | None:
    """(seq, status) of the document's row, or None before any write reached the shard."""
    shard = shard_for(zone, path, stack.settings.shards)
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        row = conn.execute(f"SELECT seq, status FROM shard_{shard}.documents WHERE zone = %s AND path = %s "
                           "AND seq >= 0", (zone, path)).fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


def _leases(stack: Stack, holder: str, *, alive: bool) -> DocumentLeases:
    client = monitor.broker_client(stack.settings)
    if alive:
        client.set(alive_key(holder), 1, px=300_000)
    else:
        client.delete(alive_key(holder))
    return DocumentLeases(client, holder=holder, ttl_s=300)


def test_a_document_leased_by_a_live_worker_waits_for_it_and_is_then_indexed(stack: Stack) -> None:
    zone, path = "delivery-busy", "held.txt"
    leases = _leases(stack, "test-live-holder", alive=True)
    lease = leases.acquire(zone, path)
    assert lease is not None
    try:
        with stack.publisher() as publisher:
            event = publisher.write(zone=zone, path=path, data=b"written while another worker held the lease")
        # The ingest worker finds the lease taken and puts the event back (every delivery.busy_retry_s);
        # while the lease is held, nothing reaches the shard.
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            assert _indexed(stack, zone, path) is None
            time.sleep(0.5)
        assert not monitor.pending_work(stack.settings, monitor.broker_client(stack.settings))["idle"]
    finally:
        leases.release(lease)
    stack.wait()
    assert _indexed(stack, zone, path) == (event.seq, "indexed")


def test_a_lease_left_by_a_dead_worker_is_taken_over_at_once(stack: Stack) -> None:
    zone, path = "delivery-dead", "orphan.txt"
    leases = _leases(stack, "test-dead-holder", alive=False)
    assert leases.acquire(zone, path) is not None  # and never released: its holder "died"
    with stack.publisher() as publisher:
        event = publisher.write(zone=zone, path=path, data=b"the previous holder of this lease is gone")
    stack.wait(timeout=60)
    assert _indexed(stack, zone, path) == (event.seq, "indexed")


def test_messages_a_dead_consumer_took_are_redelivered_and_indexed_once(stack: Stack) -> None:
    zone = "delivery-vanished"
    consumer = subprocess.Popen([sys.executable, "-c", _VANISHING_CONSUMER], env=stack.env, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert consumer.stdout is not None and consumer.stdout.readline().strip() == "ready"
        published = []
        # It competes with the ingest worker for each message: publish one event per message until it has one.
        for i in range(200):
            with stack.publisher() as publisher:
                published.append(publisher.write(zone=zone, path=f"doc_{i:03d}.txt",
                                                 data=f"document {i} of the vanished consumer test".encode()))
            if consumer.poll() is not None:
                break
            time.sleep(0.05)
        consumer.wait(timeout=60)
        tag = consumer.stdout.readline().strip()
        assert consumer.returncode == 0 and tag, consumer.stderr.read() if consumer.stderr else ""
    finally:
        if consumer.poll() is None:
            consumer.kill()
    client = monitor.broker_client(stack.settings)
    assert client.hexists("unacked", tag)  # stranded: nobody will acknowledge it
    stack.wait(timeout=120)  # counts the stranded message as pending until it is indexed
    assert not client.hexists("unacked", tag)
    assert all(_indexed(stack, zone, e.path) == (e.seq, "indexed") for e in published)
    documents = sum(row["documents"] for shard in collect_status(stack.settings, state=None)["shard_counts"]
                    for row in shard["zones"] if row["zone"] == zone)
    assert documents == len(published)


def test_status_shows_how_long_the_oldest_message_of_each_queue_has_waited(stack: Stack) -> None:
    status = collect_status(stack.settings, state=stack.state)
    queues = status["queues"]
    assert set(queues["oldest_waiting_s"]) == {"ingest", "embed", "maintenance", "query"}
    text = format_status(status)
    assert "queue    ingest" in text and "in flight" in text
    assert status["held_by_dead_workers"] == 0


def test_an_event_with_nul_characters_is_dead_lettered_not_requeued_forever(stack: Stack) -> None:
    # PostgreSQL's jsonb refuses NUL; the dead letter must still be recordable, or the message would come
    # back on its queue every few seconds for good.
    zone = "delivery-nul"
    bad = {"op": "write", "zone": zone, "path": "nul.txt", "seq": 1, "content_hash": "sha256:" + "ab" * 32,
           "metadata": {"title\x00": "a\x00b"}}
    create_app(stack.settings).send_task("shardfuse.ingest", kwargs={"events": [bad]})
    stack.wait(timeout=60)
    listing = stack.cli("deadletters", "list", "--zone", zone, "--json").stdout
    rows = json.loads(listing)
    assert len(rows) == 1 and rows[0]["path"] == "nul.txt"
    shown = json.loads(stack.cli("deadletters", "show", str(rows[0]["id"])).stdout)
    assert shown["payload"]["event"]["metadata"] == {"title\\u0000": "a\\u0000b"}  # each NUL spelled out


def test_a_bm25_rebuild_whose_message_was_lost_is_sent_again_by_the_maintenance_worker(stack: Stack) -> None:
    client = monitor.broker_client(stack.settings)
    maintenance_log = StackLayout(stack.settings.data_path).log_file("worker-maintenance")
    resent_before = maintenance_log.read_text(errors="replace").count("no rebuild is queued: sending one")
    # A write committed to shard 1 and took the schedule flag; its rebuild message was never sent (the
    # broker went away between the two). Nobody calls `shardfuse wait`, which would also re-send it.
    # Whether the shard is behind is asked of PostgreSQL: the write must be there.
    event = WriteEvent(op=Op.DELETE, zone="delivery-lost-rebuild", path=f"gone-{time.time_ns()}.txt", seq=1)
    with ShardPools(stack.settings, min_size=1, max_size=1) as pools:
        assert pools.stores()[1].apply([DocumentChange(event=event, status=DocStatus.DELETED)])[0].applied
    Bm25Freshness(client).mark_dirty(1)
    assert 1 in monitor.stale_shards(stack.settings, client)

    def caught_up() -> bool:
        return bool(next(row for row in monitor.bm25_freshness(stack.settings, client) if row["shard"] == 1)["current"])

    eventually(caught_up, timeout=LostRebuilds(stack.settings).grace_s + 30, interval=0.2,
               what="shard 1's BM25 index to catch up (the lost rebuild sent again)")
    resent = maintenance_log.read_text(errors="replace").count("no rebuild is queued: sending one")
    assert resent > resent_before
