"""Workers start in any order with their stores (issue 20, item 7).

In a normal Kubernetes start the worker pods come up before the database. A worker whose warm-up fails
must still watch deliveries at once (its liveness key, its inbox registrations, the reaping of what dead
workers held) and must index as soon as PostgreSQL answers, without being restarted.

A private stack: Redis, then the four worker pools, and PostgreSQL only at the end.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
import redis

from shardfuse import SearchClient, connect_publisher
from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.coordination.liveness import ALIVE_PREFIX
from shardfuse.workers import monitor
from shardfuse.workers.broker.inbox import INBOXES_KEY, inbox_key, register
from shardfuse.workers.broker.redelivery import UNACKED, UNACKED_INDEX
from shardfuse.workers.names import Queue
from shardfuse.workers.stack import down, read_state, up
from shardfuse.workers.stack.launcher import WORKERS
from tests.integration.ports import free_port, free_port_run
from tests.support.polling import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROBE = "shardfuse-start-order-probe"  # a queue no worker consumes: what is put back stays there to be seen
DEAD_HOLDER = "consumer@gone-host:4242:dead00"
ZONE = "startorder"


@pytest.fixture
def settings() -> Iterator[Settings]:
    """The stack's settings, its Redis already up (so they carry the passwords its first ``up`` generated)."""
    root = Path(tempfile.mkdtemp(prefix="shardfuse-start-order-"))
    redis_port, pg_port = free_port(), free_port()
    overrides: dict[str, Any] = dict(
        data_dir=root / "data", shards=2,
        broker={"url": f"redis://127.0.0.1:{redis_port}/0", "result_backend": f"redis://127.0.0.1:{redis_port}/1"},
        postgres={"dsn": f"postgresql://postgres@127.0.0.1:{pg_port}/sf_start_order"},
        stack={"flower_port": free_port(), "api_port": free_port(), "metrics_port": free_port_run(len(Queue))},
        embedder={"provider": "hashing"}, bm25={"rebuild_debounce_s": 0.2},
        delivery={"heartbeat_s": 1, "dead_after_s": 4, "busy_retry_s": 1},
        workers={"ingest_concurrency": 1, "embed_concurrency": 2, "query_concurrency": 1},
    )  # fmt: skip
    up(load_settings(**overrides), only={"redis"}, progress=lambda _: None, timeout=60)
    built = load_settings(**overrides)
    try:
        yield built
    finally:
        down(built, timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _envelope(marker: str) -> dict[str, object]:
    """A kombu message as the Redis transport stores it (anonymous exchange: its routing key is its queue)."""
    return {
        "body": base64.b64encode(json.dumps([[], {"marker": marker}, {}]).encode()).decode(),
        "content-encoding": "utf-8", "content-type": "application/json", "headers": {},
        "properties": {"delivery_tag": marker, "body_encoding": "base64", "priority": 0,
                       "delivery_info": {"exchange": "", "routing_key": PROBE}},
    }  # fmt: skip


def _plant_a_dead_workers_messages(client: redis.Redis) -> None:
    """What a worker killed an hour ago leaves behind: a message it had received (in ``unacked``, claimed by
    no live worker) and one in its inbox (registered, its liveness key long gone)."""
    client.hset(UNACKED, "dead-unacked", json.dumps([_envelope("dead-unacked"), "", PROBE]))
    client.zadd(UNACKED_INDEX, {"dead-unacked": time.time() - 3600})
    inbox = inbox_key(DEAD_HOLDER, PROBE)
    client.lpush(inbox, json.dumps(_envelope("dead-inbox")))
    register(client, inbox=inbox, holder=DEAD_HOLDER, queue=PROBE, now=time.time() - 3600)


def _registered_queues(client: redis.Redis) -> set[str]:
    return {json.loads(raw)["queue"] for raw in client.hvals(INBOXES_KEY)}


def _postgres_answers(settings: Settings) -> bool:
    try:
        with psycopg.connect(settings.postgres.dsn, connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def test_workers_started_before_postgres_watch_at_once_and_index_when_it_comes(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.broker.url)
    # The embedded broker refuses writes at its memory limit rather than grow until the OOM killer ends it.
    assert client.config_get("maxmemory") == {"maxmemory": str(settings.stack.redis_maxmemory_mb * 2**20)}
    _plant_a_dead_workers_messages(client)

    state = up(settings, only=set(WORKERS), progress=lambda _: None, timeout=240)
    pids = {name: state.components[name].pid for name in WORKERS}
    assert not _postgres_answers(settings)

    # Every pool's broker process beats and has registered an inbox for its queue, PostgreSQL or not.
    eventually(lambda: len(list(client.scan_iter(f"{ALIVE_PREFIX}consumer@*"))) >= len(WORKERS), timeout=30,
               what="a liveness key per pool", interval=0.25)
    eventually(lambda: {q.value for q in Queue} <= _registered_queues(client), timeout=30,
               what="an inbox registration per queue", interval=0.25)
    # The dead worker's messages are back on their queue: reaped without PostgreSQL.
    eventually(lambda: client.llen(PROBE) == 2, timeout=30, what="the dead worker's messages put back", interval=0.25)
    assert not client.hexists(UNACKED, "dead-unacked")
    assert not client.hexists(INBOXES_KEY, inbox_key(DEAD_HOLDER, PROBE))
    assert not _postgres_answers(settings)

    # PostgreSQL comes; the same workers index what is published now (warm-up retried in the background,
    # or done by the first task).
    up(settings, only={"postgres"}, progress=lambda _: None, timeout=120)
    path = "notes/late-database.md"
    with connect_publisher(settings) as publisher:
        publisher.write(zone=ZONE, path=path,
                        data=b"# Late\n\nThe latedatabaseterm arrived after the workers did.\n")
    assert monitor.wait_until_indexed(settings, timeout=180), "the event was not indexed after PostgreSQL started"

    search = SearchClient(settings)
    for mode in ("keyword", "semantic"):
        hits = search.search(query="latedatabaseterm arrived after the workers", zone=ZONE, mode=mode)["results"]
        assert [hit["path"] for hit in hits][:1] == [path], mode
    # Indexed by the workers started before the database: none was restarted.
    for name, pid in pids.items():
        assert psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE, name
    recorded = read_state(settings)
    assert recorded is not None and {name: recorded.components[name].pid for name in WORKERS} == pids
