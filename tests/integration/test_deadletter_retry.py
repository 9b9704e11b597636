"""Retrying dead letters sends each letter once, even when two retries run at the same time, and loses none
when a send fails (shardfuse.pipeline.admin.dead_letters.take_dead_letters, `shardfuse deadletters retry`).

Against a real PostgreSQL (and, for the command, a real Redis broker) of a private embedded stack: the row
locks that keep two retries apart are PostgreSQL's, which no fake reproduces.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from shardfuse.pipeline.admin.dead_letters import dead_letter_count, record_dead_letter, take_dead_letters
from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.index.store import ShardPools
from shardfuse.pipeline.index.store.connections import pooled_connection
from shardfuse.pipeline.index.store.schema import SHARED_SCHEMA, ensure_shared_schema
from shardfuse.workers.names import Queue
from shardfuse.workers.names import Task as TaskName
from shardfuse.workers.stack import down, up
from tests.integration.ports import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LETTERS = 300


@pytest.fixture(scope="module")
def servers() -> Iterator[Settings]:
    """Redis and PostgreSQL of a stack of this module's own (no workers: sent letters stay on their queue)."""
    root = Path(tempfile.mkdtemp(prefix="shardfuse-deadletters-"))
    redis_port, pg_port = free_port(), free_port()
    overrides: dict[str, Any] = dict(
        data_dir=root / "data",
        broker={"url": f"redis://127.0.0.1:{redis_port}/0", "result_backend": f"redis://127.0.0.1:{redis_port}/1"},
        postgres={"dsn": f"postgresql://postgres@127.0.0.1:{pg_port}/sf_deadletters"},
        stack={"flower_port": free_port(), "api_port": free_port()},
    )
    up(load_settings(**overrides), only={"redis", "postgres"}, progress=lambda _: None, timeout=120)
    settings = load_settings(**overrides)  # with the passwords that first ``up`` generated
    try:
        yield settings
    finally:
        down(settings, timeout=20)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pools(servers: Settings) -> Iterator[ShardPools]:
    with ShardPools(servers, min_size=1, max_size=4) as opened:
        with pooled_connection(opened.shared, what="the dead-letter store") as conn:
            ensure_shared_schema(conn)
            conn.execute(f"DELETE FROM {SHARED_SCHEMA}.deadletters")
        yield opened


def _record(pools: ShardPools, count: int) -> dict[int, int]:
    """``count`` dead letters, each payload marked with its number; their ids → numbers."""
    ids = {}
    for number in range(count):
        dead_id = record_dead_letter(pools.shared, task=TaskName.INGEST.value, payload={"marker": number},
                                     error_class="TestError", reason="for the retry test", attempts=1)
        ids[dead_id] = number
    return ids


def test_two_concurrent_retries_send_every_letter_exactly_once(servers: Settings, pools: ShardPools) -> None:
    _record(pools, LETTERS)
    sent: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(2)
    taken: dict[str, list[int]] = {}

    def send(task: str, payload: dict[str, Any]) -> None:
        assert task == TaskName.INGEST.value
        time.sleep(0.001)  # a broker round trip: the other retry reaches the same row meanwhile
        with lock:
            sent.append(payload["marker"])

    def retry(name: str) -> None:
        with ShardPools(servers, min_size=1, max_size=1) as own:
            start.wait()
            taken[name] = take_dead_letters(own.shared, None, send)

    threads = [threading.Thread(target=retry, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert Counter(sent) == Counter(range(LETTERS)), "a letter was sent twice or never"
    assert sorted(taken["a"] + taken["b"]) == sorted(set(taken["a"]) | set(taken["b"]))
    assert len(taken["a"]) + len(taken["b"]) == LETTERS
    assert dead_letter_count(pools.shared) == 0
    print(f"retry a sent {len(taken['a'])}, retry b sent {len(taken['b'])} of {LETTERS}")


def test_a_failed_send_leaves_the_letter_and_the_ones_after_it(pools: ShardPools) -> None:
    ids = _record(pools, 20)
    failing = sorted(ids)[7]
    sent: list[int] = []

    def send(task: str, payload: dict[str, Any]) -> None:
        if payload["marker"] == ids[failing]:
            raise ConnectionError("the broker went away")
        sent.append(payload["marker"])

    with pytest.raises(ConnectionError):
        take_dead_letters(pools.shared, None, send)
    assert sent == list(range(7))
    assert dead_letter_count(pools.shared) == 13  # the failed one and the twelve after it
    assert take_dead_letters(pools.shared, None, lambda task, payload: sent.append(payload["marker"])) == sorted(
        ids)[7:]
    assert Counter(sent) == Counter(range(20))


def _queued_markers(settings: Settings) -> list[int]:
    """The marker of every message on the ingest queue (kombu envelopes; bodies are JSON [args, kwargs, embed])."""
    client = redis.Redis.from_url(settings.broker.url)
    try:
        raw = client.lrange(Queue.INGEST.value, 0, -1)
    finally:
        client.close()
    markers = []
    for envelope in map(json.loads, raw):
        _args, kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
        markers.append(kwargs["marker"])
    return markers


def test_two_retry_commands_at_once_queue_each_letter_once(servers: Settings, pools: ShardPools) -> None:
    _record(pools, LETTERS)
    client = redis.Redis.from_url(servers.broker.url)
    client.delete(Queue.INGEST.value)
    client.close()
    env = {**os.environ, "SHARDFUSE_DATA_DIR": str(servers.data_dir), "SHARDFUSE_BROKER__URL": servers.broker.url,
           "SHARDFUSE_BROKER__RESULT_BACKEND": servers.broker.result_backend,
           "SHARDFUSE_POSTGRES__DSN": servers.postgres.dsn}
    command = [sys.executable, "-m", "shardfuse.workers.cli.main", "deadletters", "retry", "--all"]
    runs = [subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=180) for run in runs]
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err
        assert out.startswith("retried "), out
    counts = [int(out.split()[1]) for out, _ in outputs]

    assert sum(counts) == LETTERS
    assert Counter(_queued_markers(servers)) == Counter(range(LETTERS))
    assert dead_letter_count(pools.shared) == 0
    print(f"the two commands retried {counts[0]} and {counts[1]} of {LETTERS}")
