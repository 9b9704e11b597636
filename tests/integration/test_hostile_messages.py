"""Issue 20's acceptance fuzz test: hundreds of hypothesis-generated hostile messages pushed raw onto every
queue of a running stack, interleaved with good work. Every good message is applied (documents findable by
both legs, searches answered), every worker process survives (same pids), and every hostile message is set
aside with a reason: in ``shardfuse:unreadable`` by the transport, as a dead letter by its task, or as an
error answered for a search. ``shardfuse status`` shows them.
"""

from __future__ import annotations

import base64
import copy
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import psycopg
import pytest
import redis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import UnreadableMessageError
from shardfuse.pipeline.index.store.schema import SHARED_SCHEMA
from shardfuse.workers.app import create_app
from shardfuse.workers.broker.envelope import QUEUE_TASKS, check_envelope
from shardfuse.workers.broker.inbox import UNREADABLE_KEY
from shardfuse.workers.names import Queue, Task
from tests.integration.conftest import Stack, running_stack
from tests.support.polling import eventually

pytestmark = pytest.mark.integration

HOSTILE_PER_QUEUE = 200
GOOD_DOCUMENTS = 20
ZONE = "hostile"
MAX_MESSAGE_BYTES = 256 * 1024  # small, so that oversize items cost little to make
FIXED_ID = "00000000-0000-4000-8000-000000000000"
# Arguments each pipeline task dead-letters at once (refuse_malformed), and those the search task refuses.
_TASK_ARGUMENTS = {Queue.INGEST: ("event", "events", "refresh"), Queue.EMBED: ("document", "documents")}


@dataclass(frozen=True)
class Hostile:
    queue: Queue
    item: bytes
    fate: str  # "unreadable" (the transport), "dead letter" (the task), "error" (a search answered with one)
    task_id: str | None = None


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    overrides = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
        "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.2",
        "SHARDFUSE_SHARDS": "2",
        "SHARDFUSE_DELIVERY__HEARTBEAT_S": "1",
        "SHARDFUSE_DELIVERY__DEAD_AFTER_S": "6",
        "SHARDFUSE_BROKER__MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
    }
    with running_stack(overrides) as running:
        yield running


def _templates() -> dict[Queue, dict[str, Any]]:
    """A real envelope of each queue's task, as Celery builds it (kombu's in-memory transport keeps it)."""
    app = create_app(Settings(broker={"url": "memory://", "result_backend": "cache+memory://"}))
    sends = {Queue.INGEST: (Task.INGEST, {"events": []}), Queue.EMBED: (Task.EMBED, {"documents": []}),
             Queue.MAINTENANCE: (Task.BM25_REBUILD, {"shard": 0}), Queue.QUERY: (Task.SEARCH, {"query": "q"})}
    templates = {}
    with app.connection_for_read() as conn:
        for queue, (task, kwargs) in sends.items():
            app.send_task(task.value, kwargs=kwargs)
            template = conn.default_channel._get(queue.value)
            # What differs from run to run made fixed, so that every run generates the same items.
            template["headers"].update(id=FIXED_ID, root_id=FIXED_ID, origin="fuzz@host", shardfuse_published=1.5e9)
            template["properties"].update(correlation_id=FIXED_ID, reply_to=FIXED_ID, delivery_tag=FIXED_ID)
            templates[queue] = template
    return templates


def _json() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


def _with_body(template: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    payload = copy.deepcopy(template)
    task_id = str(uuid.uuid4())
    payload["headers"].update(id=task_id, root_id=task_id)
    payload["body"] = base64.b64encode(json.dumps([[], kwargs, {}]).encode()).decode()
    return payload


def _mutated(template: dict[str, Any], data: Any) -> bytes:
    """The template with one field replaced by arbitrary JSON, deleted, or the whole cut short or padded."""
    payload = copy.deepcopy(template)
    how = data.draw(st.sampled_from(["replace", "delete", "cut", "pad", "nest"]))
    text = json.dumps(payload)
    if how == "cut":
        return text.encode()[:data.draw(st.integers(1, len(text) - 1))]
    if how == "pad":
        return json.dumps({**payload, "pad": "x" * MAX_MESSAGE_BYTES}).encode()
    if how == "nest":
        depth = data.draw(st.integers(65, 5000))
        return ("[" * depth + "]" * depth).encode()
    section = data.draw(st.sampled_from(["headers", "properties", None]))
    target = payload if section is None else payload[section]
    key = data.draw(st.sampled_from(sorted(target)))
    if how == "delete":
        del target[key]
    else:
        target[key] = data.draw(_json())
    return json.dumps(payload).encode()


def _hostile_strategy(queue: Queue, template: dict[str, Any]) -> st.SearchStrategy[Hostile]:
    @st.composite
    def hostile(draw: Any) -> Hostile:
        kinds = ["bytes", "json", "mutated"] + (["arguments"] * 2 if queue is not Queue.MAINTENANCE else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "arguments":  # a well-formed message its task must refuse
            unknown = draw(st.dictionaries(st.text(min_size=1, max_size=8).map(lambda s: f"x_{s}"), _json(),
                                           min_size=1, max_size=2))
            if queue is Queue.QUERY:
                kwargs = {**draw(st.dictionaries(st.sampled_from(["query", "zone", "k", "mode"]), _json())), **unknown}
            else:
                listed = _TASK_ARGUMENTS[queue][1]  # events / documents
                kwargs = draw(st.sampled_from([unknown, {listed: draw(_json().filter(
                    lambda v: v is not None and not isinstance(v, list)))}]))
                if queue is Queue.INGEST and draw(st.booleans()):
                    kwargs = {"events": [draw(_json())]}  # one event that is no write event
            payload = _with_body(template, kwargs)
            return Hostile(queue, json.dumps(payload).encode(), "error" if queue is Queue.QUERY else "dead letter",
                           payload["headers"]["id"])
        if kind == "bytes":
            item = draw(st.binary(min_size=0, max_size=200))
        elif kind == "json":
            item = json.dumps(draw(_json())).encode()
        else:
            item = _mutated(template, draw(st.data()))
        try:
            check_envelope(item, max_bytes=MAX_MESSAGE_BYTES, tasks=QUEUE_TASKS[queue.value], queue=queue.value)
        except UnreadableMessageError:
            return Hostile(queue, item, "unreadable")
        # A mutation the check lets through is a message like any other (say a changed "origin"): not hostile.
        return draw(st.nothing())

    return hostile()


def _generate(strategy: st.SearchStrategy[Hostile], count: int) -> list[Hostile]:
    """``count`` examples of ``strategy``, the same ones at every run (derandomized, no example database)."""
    examples: list[Hostile] = []

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example: Hostile) -> None:
        examples.append(example)

    collect()
    return examples


def _worker_pids(stack: Stack) -> dict[str, set[int]]:
    """Each worker pool's processes: its main process and its pool's children (prefork)."""
    pids = {}
    for name, comp in stack.state.components.items():
        if not name.startswith("worker-"):
            continue
        pids[name] = {comp.pid}
        pids[name].update(child.pid for child in psutil.Process(comp.pid).children(recursive=True))
    return pids


def _failed_results(backend: redis.Redis, task_ids: list[str]) -> int:
    failed = 0
    for task_id in task_ids:
        raw = backend.get(f"celery-task-meta-{task_id}")
        if raw is not None and json.loads(raw)["status"] == "FAILURE":
            failed += 1
    return failed


def _dead_letters(stack: Stack) -> Counter[str]:
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        rows = conn.execute(f"SELECT task, count(*) FROM {SHARED_SCHEMA}.deadletters GROUP BY task").fetchall()
    return Counter({str(task): int(n) for task, n in rows})


def test_hostile_messages_on_every_queue_are_set_aside_and_good_work_goes_on(stack: Stack) -> None:
    started = time.monotonic()
    templates = _templates()
    hostile = {queue: _generate(_hostile_strategy(queue, templates[queue]), HOSTILE_PER_QUEUE) for queue in Queue}
    assert all(len(items) >= HOSTILE_PER_QUEUE for items in hostile.values())
    broker = redis.Redis.from_url(stack.settings.broker.url)
    backend = redis.Redis.from_url(stack.settings.broker.result_backend)
    pids = _worker_pids(stack)
    assert len(pids) == len(Queue)
    words = [f"hostilprobe{i}zq" for i in range(GOOD_DOCUMENTS)]
    answered = 0
    for i, word in enumerate(words):
        for queue in Queue:  # a slice of each queue's hostile items, then good work behind them
            for one in hostile[queue][i::GOOD_DOCUMENTS]:
                broker.lpush(queue.value, one.item)
        with stack.publisher() as publisher:
            publisher.write(zone=ZONE, path=f"good/doc_{i:02d}.md", data=f"# Note {i}\n\nThe word {word} is here.\n"
                                                                         .encode())
        answered += "results" in stack.search("note", ZONE, mode="keyword")
    assert answered == GOOD_DOCUMENTS  # every search answered while the hostile items went through

    sent = [one for items in hostile.values() for one in items]
    fates = Counter(one.fate for one in sent)
    expected_letters = Counter({Task.INGEST.value: sum(1 for one in hostile[Queue.INGEST] if one.fate == "dead letter"),
                                Task.EMBED.value: sum(1 for one in hostile[Queue.EMBED] if one.fate == "dead letter")})
    stack.wait(timeout=240)
    eventually(lambda: broker.llen(UNREADABLE_KEY) >= fates["unreadable"], timeout=120, what="the unreadable items")
    eventually(lambda: _dead_letters(stack) == expected_letters, timeout=120, what="the dead letters")
    query_errors = [one.task_id for one in hostile[Queue.QUERY] if one.fate == "error" and one.task_id]
    eventually(lambda: _failed_results(backend, query_errors) == len(query_errors), timeout=60,
               what="the refused searches")

    # Every good document, by each leg.
    for i, word in enumerate(words):
        for mode in ("keyword", "semantic"):
            paths = {r["path"] for r in stack.search(word, ZONE, mode=mode, k=20)["results"]}
            assert f"good/doc_{i:02d}.md" in paths, (word, mode)
    # Every hostile item set aside with a reason, on the queue it came from; nothing else set aside.
    records = [json.loads(raw) for raw in broker.lrange(UNREADABLE_KEY, 0, -1)]
    assert Counter(r["queue"] for r in records) == Counter(one.queue.value for one in sent if one.fate == "unreadable")
    assert sorted(base64.b64decode(r["message"]) for r in records) == sorted(
        one.item for one in sent if one.fate == "unreadable")
    assert all(r["reason"] for r in records)
    assert fates["unreadable"] + sum(expected_letters.values()) + len(query_errors) == len(sent)
    assert _worker_pids(stack) == pids  # no worker (nor pool child) died or was replaced
    for queue in Queue:
        assert broker.llen(queue.value) == 0, queue

    status = stack.cli("status").stdout
    assert f"unread   {fates['unreadable']} message(s) no worker could run" in status
    assert f"dead letters: {sum(expected_letters.values())}" in status
    print(json.dumps({"hostile_per_queue": {q.value: len(hostile[q]) for q in Queue},
                      "set_aside": fates["unreadable"], "dead_lettered": dict(expected_letters),
                      "search_errors": len(query_errors), "good_documents": GOOD_DOCUMENTS,
                      "good_searches": answered, "seconds": round(time.monotonic() - started, 1)}))
