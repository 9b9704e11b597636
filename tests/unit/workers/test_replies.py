"""A search's reply list (workers/replies.py), against fakeredis: what the worker pushes is what the client
takes, errors keep their type, a wait ends on time, and a worker writes to no key outside the namespace."""

from __future__ import annotations

import time

import fakeredis
import pytest

from shardfuse.pipeline.core.errors import InvalidQueryError, LeaseLostError, RemoteSearchError, StoreUnavailableError
from shardfuse.workers import replies


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def test_an_answer_pushed_by_the_worker_is_what_the_client_takes_and_the_list_expires(
        client: fakeredis.FakeRedis) -> None:
    address = replies.new_address()
    answer = {"results": [{"chunk_id": "a", "score": 0.5}], "timings_ms": {"total": 1.25}}
    replies.send(client, address, replies.success(answer))
    assert 0 < client.ttl(address) <= replies.TTL_S
    assert replies.wait(client, address, 1.0) == answer
    assert not client.exists(address)  # taken: nothing is left behind


def test_the_first_of_two_copies_answers_and_the_second_is_left_to_expire(client: fakeredis.FakeRedis) -> None:
    address = replies.new_address()
    replies.send(client, address, replies.success({"copy": 1}))
    replies.send(client, address, replies.success({"copy": 2}))
    assert replies.wait(client, address, 1.0) == {"copy": 1}
    assert client.llen(address) == 1 and client.ttl(address) > 0


def test_a_shardfuse_error_is_raised_as_its_own_type_with_its_message(client: fakeredis.FakeRedis) -> None:
    address = replies.new_address()
    replies.send(client, address, replies.failure(InvalidQueryError("k must be at least 1")))
    with pytest.raises(InvalidQueryError, match="k must be at least 1"):
        replies.wait(client, address, 1.0)
    # One whose constructor takes keyword-only extras too.
    replies.send(client, address, replies.failure(LeaseLostError("lost", stored_fence=3)))
    with pytest.raises(LeaseLostError, match="lost"):
        replies.wait(client, address, 1.0)


def test_any_other_error_names_its_type(client: fakeredis.FakeRedis) -> None:
    address = replies.new_address()
    replies.send(client, address, replies.failure(ZeroDivisionError("division by zero")))
    with pytest.raises(RemoteSearchError, match="ZeroDivisionError: division by zero"):
        replies.wait(client, address, 1.0)
    # A type name that is in the errors module but not an exception of ours is not instantiated.
    client.rpush(address, b'{"error": {"type": "Any", "message": "m"}}')
    with pytest.raises(RemoteSearchError, match="Any: m"):
        replies.wait(client, address, 1.0)


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'{"answer": 3}', b'{"other": {}}', b"\xff\xfe",
                                 b"[" * 100_000 + b"]" * 100_000])
def test_anything_else_on_the_list_is_a_remote_search_error_saying_so(client: fakeredis.FakeRedis,
                                                                      raw: bytes) -> None:
    address = replies.new_address()
    client.rpush(address, raw)
    with pytest.raises(RemoteSearchError, match="not an answer or an error"):
        replies.wait(client, address, 1.0)


def test_a_wait_with_no_answer_returns_none_once_its_time_is_up(client: fakeredis.FakeRedis) -> None:
    started = time.monotonic()
    assert replies.wait(client, replies.new_address(), 0.2) is None
    assert 0.15 <= time.monotonic() - started < 2.0
    assert replies.wait(client, replies.new_address(), -1.0) is None  # a deadline already past


def test_only_addresses_in_the_namespace_are_replied_to() -> None:
    address = replies.new_address()
    assert replies.address_of(address) == address and address != replies.new_address()
    for other in (None, 42, "celery-task-meta-x", "_kombu.binding.query", "", replies.PREFIX[:-1]):
        assert replies.address_of(other) is None


def test_redis_errors_become_store_unavailable() -> None:
    down = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    down.connection_pool.connection_kwargs["server"].connected = False
    with pytest.raises(StoreUnavailableError, match="cannot send"):
        replies.send(down, replies.new_address(), replies.success({}))
    with pytest.raises(StoreUnavailableError, match="cannot read"):
        replies.wait(down, replies.new_address(), 0.1)


def test_an_error_that_cannot_be_sent_is_logged_not_raised_over_the_search_s_own(
        client: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture) -> None:
    address = replies.new_address()
    replies.send_failure(client, address, InvalidQueryError("k must be at least 1"))
    with pytest.raises(InvalidQueryError, match="k must be at least 1"):
        replies.wait(client, address, 1.0)
    down = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    down.connection_pool.connection_kwargs["server"].connected = False
    with caplog.at_level("WARNING", logger="shardfuse.workers.replies"):
        replies.send_failure(down, address, InvalidQueryError("k must be at least 1"))  # returns
    assert "was not sent" in caplog.text and address in caplog.text
