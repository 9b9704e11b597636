"""The publisher's sink (shardfuse.workers.publishing) and the search client (shardfuse.workers.client) on a
broker that is not there: a StoreUnavailableError at once, naming the broker with its password masked, never a
kombu, redis-py or Celery result-backend error (both send with ``ignore_result``: they never subscribe to a
result)."""

from __future__ import annotations

import socket
import time

import pytest

from shardfuse.pipeline.config.settings import BrokerSettings, Settings
from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.workers.client import SearchClient
from shardfuse.workers.publishing import CeleryEventSink

PASSWORD = "s3cret-broker-pw"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_broker_that_is_not_there_is_store_unavailable_naming_it() -> None:
    port = _closed_port()
    settings = Settings(broker=BrokerSettings(url=f"redis://:{PASSWORD}@127.0.0.1:{port}/0"))
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught, CeleryEventSink.connect(settings) as sink:
        sink.send(WriteEvent(op=Op.DELETE, zone="z", path="a.md", seq=1))
    assert time.monotonic() - started < 10  # kombu's few publish retries, not the result backend's long ones
    message = str(caught.value)
    assert f"the broker at redis://:***@127.0.0.1:{port}/0" in message
    assert PASSWORD not in message


def test_a_search_through_a_broker_that_is_not_there_is_store_unavailable_naming_it() -> None:
    port = _closed_port()
    settings = Settings(broker=BrokerSettings(url=f"redis://:{PASSWORD}@127.0.0.1:{port}/0"))
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        SearchClient(settings).search("anything", zone="z")
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert f"the broker at redis://:***@127.0.0.1:{port}/0" in message
    assert PASSWORD not in message
