"""A publisher against a real Redis near its maxmemory: it refuses new events with a clear error and keeps
them, leaving the workers the headroom to drain the queues, and publishes them once there is room again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.workers.publishing import CeleryEventSink
from tests.support.socket_redis import loopback_redis


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with loopback_redis(tmp_path, "--maxmemory-policy", "noeviction") as port:
        yield f"redis://127.0.0.1:{port}/0"


def _event(i: int) -> WriteEvent:
    return WriteEvent(op=Op.DELETE, zone="headroom", path=f"doc{i}.txt", seq=time.time_ns())


def test_a_publisher_stops_at_the_high_water_mark_keeps_its_events_and_sends_them_once_there_is_room(
        url: str) -> None:
    client = redis.Redis.from_url(url)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(int(used / 0.8)))  # the server is at 80 % of its limit
    settings = Settings(broker={"url": url, "result_backend": url, "publish_high_water": 0.7,
                                "events_per_message": 2})
    with pytest.raises(StoreUnavailableError, match=r"maxmemory, past broker.publish_high_water \(70%\)"), \
            CeleryEventSink.connect(settings) as sink:
        sink.send(_event(1))
        sink.send(_event(2))  # a full message: flushed, refused
    assert client.llen("ingest") == 0  # nothing half-sent

    with CeleryEventSink.connect(settings) as sink:
        sink.send(_event(3))
        with pytest.raises(StoreUnavailableError):
            sink.flush()
        client.config_set("maxmemory", "0")  # room again (no limit)
        time.sleep(1.1)  # the mark is read again at most once a second
        sink.flush()  # the kept event goes out now
    assert client.llen("ingest") == 1
