"""The envelope check (shardfuse.workers.broker.envelope): every message our senders put on a queue passes
it, and any other bytes are refused with a reason, never with any other exception."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu.transport.virtual import Message

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import UnreadableMessageError
from shardfuse.workers.app import create_app
from shardfuse.workers.broker.envelope import QUEUE_TASKS, check_envelope
from shardfuse.workers.names import Queue, Task

LIMIT = 1 << 20
EVENT = {"event_id": "e1", "op": "write", "zone": "docs", "path": "a.md", "content_hash": "sha256:" + "a" * 64,
         "size": 3, "seq": 1}


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app(Settings(broker={"url": "memory://", "result_backend": "cache+memory://"}))


def _sent(app: Any, task: Task, queue: Queue, kwargs: dict[str, Any], **options: Any) -> dict[str, Any]:
    """The kombu payload Celery puts on ``queue`` for ``task`` (the in-memory transport keeps it as is)."""
    app.send_task(task.value, kwargs=kwargs, **options)
    with app.connection_for_read() as conn:
        payload: dict[str, Any] = conn.default_channel._get(queue.value)
    return payload


@pytest.fixture(scope="module")
def real(app: Any) -> dict[str, dict[str, Any]]:
    """One message of each kind our senders publish: search RPC, an ingest message of events (the publisher),
    an embed message, a countdown (ETA) rebuild and a message kombu put back after a dead worker."""
    restored = _sent(app, Task.BM25_REBUILD, Queue.MAINTENANCE, {"shard": 1, "merge": True})
    restored["headers"]["redelivered"] = True  # what kombu's _do_restore_message adds
    restored["properties"]["delivery_info"]["redelivered"] = True
    return {
        "search": _sent(app, Task.SEARCH, Queue.QUERY, {"query": "x", "zone": "z", "k": 5}, expires=30),
        "ingest": _sent(app, Task.INGEST, Queue.INGEST, {"events": [EVENT, {**EVENT, "seq": 2}]}, ignore_result=True),
        "embed": _sent(app, Task.EMBED, Queue.EMBED, {"documents": [{"zone": "docs", "chunks": ["ü" * 100]}]}),
        "eta": _sent(app, Task.BM25_REBUILD, Queue.MAINTENANCE, {"shard": 0}, countdown=5),
        "restored": restored,
    }


def _check(payload: Any, *, queue: str = "query", raw: bytes | None = None) -> dict[str, Any]:
    item = json.dumps(payload).encode() if raw is None else raw
    return check_envelope(item, max_bytes=LIMIT, tasks=QUEUE_TASKS.get(queue), queue=queue)


def _queue_of(payload: dict[str, Any]) -> str:
    return str(payload["properties"]["delivery_info"]["routing_key"])


def test_every_message_our_senders_publish_passes(real: dict[str, dict[str, Any]]) -> None:
    for name, payload in real.items():
        assert _check(payload, queue=_queue_of(payload)) == payload, name


def test_a_message_passes_only_on_the_queue_of_its_task(real: dict[str, dict[str, Any]]) -> None:
    with pytest.raises(UnreadableMessageError, match="not one this queue runs"):
        _check({**real["search"], "properties": {**real["search"]["properties"],
                                                 "delivery_info": {"exchange": "", "routing_key": "ingest"}}},
               queue="ingest")
    with pytest.raises(UnreadableMessageError, match="not to queue 'ingest'"):
        _check({**real["ingest"], "properties": {**real["ingest"]["properties"],
                                                 "delivery_info": {"exchange": "", "routing_key": "embed"}}},
               queue="ingest")


def _body(payload: dict[str, Any], body: Any) -> dict[str, Any]:
    return {**payload, "body": base64.b64encode(json.dumps(body).encode()).decode()}


def _headers(payload: dict[str, Any], **headers: Any) -> dict[str, Any]:
    return {**payload, "headers": {**payload["headers"], **headers}}


def _hostile(real: dict[str, Any]) -> Iterator[tuple[str, bytes, str]]:
    """(name, item, the reason it is refused for), items made from the real search message."""
    search = real["search"]
    yield "the issue's incomplete envelope", b'{"body": "e30=", "headers": {}}', "has no 'content-type'"
    yield "not UTF-8", b"\xff\xfe{}", "not UTF-8"
    yield "not JSON", b"hello", "is not JSON"
    yield "truncated", json.dumps(search).encode()[:-7], "truncated JSON"
    yield "a list", b"[1, 2]", "a JSON list, not an object"
    yield "deep nesting", b"[" * 100_000 + b"]" * 100_000, "nests deeper than 64"
    yield "deep inside the body", json.dumps(_body(search, [[], {"deep": json.loads("[" * 80 + "]" * 80)}, {}])
                                             ).encode(), "body nests deeper"
    yield "oversize", json.dumps({**search, "pad": "x" * LIMIT}).encode(), "more than broker.max_message_bytes"
    yield "pickle", json.dumps({**search, "content-type": "application/x-python-serialize"}).encode(), \
        "only application/json"
    yield "body not base64", json.dumps({**search, "body": "%%%"}).encode(), "not base64"
    yield "body a number", json.dumps({**search, "body": 5}).encode(), "is a int, not a str"
    yield "positional args", json.dumps(_body(search, [[1], {}, {}])).encode(), "positional argument"
    yield "body not a triple", json.dumps(_body(search, {"a": 1})).encode(), "not a task body"
    yield "kwargs a list", json.dumps(_body(search, [[], [], {}])).encode(), "[list, list, dict]"
    yield "a chained task", json.dumps(_body(search, [[], {}, {"chain": [{"task": "x"}]}])).encode(), "links"
    yield "unknown task", json.dumps(_headers(search, task="celery.ping")).encode(), "not one this queue runs"
    yield "no task id", json.dumps(_headers(search, id="")).encode(), "header 'id'"
    yield "compression", json.dumps(_headers(search, compression="application/x-gzip")).encode(), \
        "header 'compression'"
    yield "overwrites the context", json.dumps(_headers(search, update=1)).encode(), "header 'update'"
    yield "bad eta", json.dumps(_headers(search, eta="tomorrow")).encode(), "header 'eta'"
    yield "bad time limit", json.dumps(_headers(search, timelimit=["x", None])).encode(), "header 'timelimit'"
    yield "no delivery info", json.dumps({**search, "properties": {"body_encoding": "base64"}}).encode(), \
        "has no 'delivery_info'"
    yield "bad priority", json.dumps({**search, "properties": {**search["properties"], "priority": "hi"}}).encode(), \
        "priority"


def test_each_kind_of_hostile_item_is_refused_with_its_reason(real: dict[str, dict[str, Any]]) -> None:
    refused = {}
    for name, item, reason in _hostile(real):
        with pytest.raises(UnreadableMessageError, match=reason) as caught:
            _check(None, raw=item)
        refused[name] = str(caught.value)
    assert len(refused) == 23, refused


def _json() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20)


def _refused_or_runnable(item: bytes, queue: str = "query") -> None:
    """The property: the check raises nothing but UnreadableMessageError, and what it passes kombu can turn
    into a message (given a fresh delivery tag) whose body is a task body."""
    try:
        payload = check_envelope(item, max_bytes=LIMIT, tasks=QUEUE_TASKS.get(queue), queue=queue)
    except UnreadableMessageError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    payload["properties"]["delivery_tag"] = "fresh"  # as the transport does before delivering it
    message = Message(payload, channel=_CHANNEL)
    args, kwargs, embed = message.decode()
    assert args == [] and isinstance(kwargs, dict) and isinstance(embed, dict)


class _Channel:
    """What kombu's Message asks of its channel: decoding the body."""

    @staticmethod
    def decode_body(body: str, encoding: str | None) -> bytes:
        assert encoding == "base64"
        return base64.b64decode(body)


_CHANNEL = _Channel()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_refused_with_a_reason(item: bytes) -> None:
    _refused_or_runnable(item)


@settings(max_examples=300, deadline=None)
@given(_json())
def test_arbitrary_json_is_refused_with_a_reason(value: Any) -> None:
    _refused_or_runnable(json.dumps(value).encode())


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths(inner, (*path, index))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_real_envelope_is_refused_or_still_runnable(real: dict[str, dict[str, Any]], data: Any) -> None:
    original = real[data.draw(st.sampled_from(sorted(real)))]
    payload = copy.deepcopy(original)
    path = data.draw(st.sampled_from(list(_paths(payload))[1:]))
    parent = payload
    for step in path[:-1]:
        parent = parent[step]
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        parent[path[-1]] = data.draw(_json())
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[data.draw(st.text(max_size=12))] = data.draw(_json())
    else:
        parent.append(data.draw(_json()))
    _refused_or_runnable(json.dumps(payload).encode(), _queue_of(original))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_cut_or_corrupted_real_envelope_is_refused_or_still_runnable(real: dict[str, dict[str, Any]],
                                                                     data: Any) -> None:
    original = real[data.draw(st.sampled_from(sorted(real)))]
    item = bytearray(json.dumps(original).encode())
    if data.draw(st.booleans()):
        del item[data.draw(st.integers(0, len(item) - 1)):]
    else:
        item[data.draw(st.integers(0, len(item) - 1))] = data.draw(st.integers(0, 255))
    _refused_or_runnable(bytes(item), _queue_of(original))
