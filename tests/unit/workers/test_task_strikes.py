"""A message the hard time limit keeps killing (shardfuse.workers.tasks.strikes, PipelineTask): each kill is
a strike for each of its items, recorded in the worker's main process; the message comes back (never
acknowledged on a timeout), and an item with MAX_STRIKES is dead-lettered instead of run again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fakeredis
import pytest
from celery import Celery
from celery.exceptions import TimeLimitExceeded

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.app import create_app
from shardfuse.workers.tasks import base
from shardfuse.workers.tasks.base import PipelineTask, message_items
from shardfuse.workers.tasks.strikes import MAX_STRIKES, HardLimitStrikes, item_key, message_items_of


@pytest.fixture
def redis_client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture
def app(redis_client: fakeredis.FakeRedis) -> Celery:
    app = create_app(Settings())
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    app.shardfuse_runtime.get().__dict__["_redis"] = redis_client  # the runtime's Redis, on fakeredis
    return app


@pytest.fixture
def dead_letters(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    recorded: list[dict[str, Any]] = []

    def record(pool: Any, **letter: Any) -> int:
        recorded.append(letter)
        return len(recorded)

    monkeypatch.setattr(base, "record_dead_letter", record)
    monkeypatch.setattr(type(create_app(Settings()).shardfuse_runtime.get()), "shared_pool", None)
    return recorded


def _items_task(app: Celery, ran: list[list[int]]) -> Any:
    @app.task(name="test.struck", bind=True, base=PipelineTask, time_limit=150, shared=False)
    def items(self: PipelineTask, item: int | None = None, items: list[int] | None = None) -> dict[str, Any]:
        def work(xs: Sequence[int]) -> tuple[dict[str, Any], list[tuple[Any, BaseException]]]:
            ran.append(list(xs))
            return {"done": len(xs)}, []

        return self.guarded_each("item", message_items(item, items), work)

    return items


def test_the_app_never_acknowledges_a_run_the_hard_limit_killed() -> None:
    assert create_app(Settings()).conf.task_acks_on_timeout is False


def test_a_kill_by_the_hard_limit_is_a_strike_for_each_item_and_other_failures_are_not(
    app: Celery, redis_client: fakeredis.FakeRedis
) -> None:
    task = _items_task(app, [])
    task.on_failure(TimeLimitExceeded(150), "task-1", (), {"items": [1, 2]}, None)
    task.on_failure(ValueError("a bug"), "task-1", (), {"items": [1, 2]}, None)
    task.on_failure(TimeLimitExceeded(150), "task-2", (), {"items": [2, 3]}, None)  # 2 travelled on
    assert HardLimitStrikes(redis_client).counts([1, 2, 3, 4]) == [1, 2, 1, 0]
    assert redis_client.ttl(item_key(2)) > 0  # forgotten in time
    assert message_items_of({"event": {"a": 1}, "refresh": False}) == [{"a": 1}]
    assert message_items_of({"shard": 3}) == [{"shard": 3}]  # a message of no items is its own item


def test_items_struck_out_are_dead_lettered_without_running_and_the_others_run(
    app: Celery, redis_client: fakeredis.FakeRedis, dead_letters: list[dict[str, Any]]
) -> None:
    ran: list[list[int]] = []
    task = _items_task(app, ran)
    strikes = HardLimitStrikes(redis_client)
    for _ in range(MAX_STRIKES - 1):
        strikes.record([1, 2])
    assert task.apply(kwargs={"items": [1, 2]}).result == {"done": 2, "dead_letters": 0, "busy": 0}
    strikes.record([1])
    result = task.apply(kwargs={"items": [1, 2, 3]}).result
    assert ran == [[1, 2], [2, 3]]  # item 1 did not run again
    assert result == {"done": 2, "dead_letters": 1, "busy": 0}
    assert [letter["payload"] for letter in dead_letters] == [{"item": 1}]
    assert f"exceeded the hard time limit (150s) {MAX_STRIKES} times" in dead_letters[0]["reason"]
    assert dead_letters[0]["error_class"] == "shardfuse.workers.tasks.strikes.HardTimeLimitError"


def test_a_document_is_known_by_its_event_and_never_shares_its_events_strikes(
        redis_client: fakeredis.FakeRedis) -> None:
    event = {"op": "write", "zone": "z", "path": "a.txt", "seq": 3, "content_hash": "sha256:" + "1" * 64}
    document = {"event": event, "shard": 0, "chunks": [{"text": "a long chunk " * 100}], "refresh": False}
    strikes = HardLimitStrikes(redis_client)
    strikes.record([document])
    # The same document in another message, its dict built again, keeps its strike; its event has none.
    assert strikes.counts([{**document, "chunks": [dict(c) for c in document["chunks"]]}, event]) == [1, 0]
    assert item_key({**document, "chunks": []}) == item_key(document)  # its event determines it: not digested
    assert item_key({**document, "refresh": True}) != item_key(document)
    assert item_key({**document, "event": {**event, "seq": 4}}) != item_key(document)
    # Anything that is not a document of that form is digested whole, as before.
    assert item_key({"event": "not a dict", "chunks": []}) != item_key({"event": "not a dict", "chunks": [1]})
