"""How a pipeline task (shardfuse.workers.tasks.base.PipelineTask) carries out what settling decided, on an
eager app: a retry with jittered backoff, and the whole message back on its queue when the broker or the
dead-letter store cannot be reached to record the outcome."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Reject, Retry
from kombu.exceptions import OperationalError

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import DocumentBusyError, InvalidEventError, StoreUnavailableError
from shardfuse.workers.app import create_app
from shardfuse.workers.tasks import base
from shardfuse.workers.tasks.base import PipelineTask, message_items

# Nothing listens on port 1: the dead-letter table is out of reach.
DOWN = {"postgres": {"dsn": "postgresql://postgres@127.0.0.1:1/down"}, "workers": {"max_retries": 10}}


@pytest.fixture
def eager_app(monkeypatch: pytest.MonkeyPatch) -> Celery:
    monkeypatch.setattr(base, "REQUEUE_PAUSE_S", 0)
    app = create_app(Settings(**DOWN))  # type: ignore[arg-type]
    app.conf.task_always_eager = True
    return app


def _whole_task(app: Celery, error: BaseException) -> Any:
    @app.task(name="test.whole", bind=True, base=PipelineTask, shared=False)
    def whole(self: PipelineTask, shard: int) -> dict[str, Any]:
        def work() -> dict[str, Any]:
            raise error

        return self.guarded({"shard": shard}, work)

    return whole


def _items_task(app: Celery, error_for: Any) -> Any:
    @app.task(name="test.items", bind=True, base=PipelineTask, shared=False)
    def items(self: PipelineTask, item: int | None = None, items: list[int] | None = None) -> dict[str, Any]:
        def work(xs: Sequence[int]) -> tuple[dict[str, Any], list[tuple[Any, BaseException]]]:
            return {}, [(x, error_for(x)) for x in xs if error_for(x) is not None]

        return self.guarded_each("item", message_items(item, items), work)

    return items


@pytest.mark.parametrize("retries", [0, 3, 9])  # the last past the cap: 2**9 > 60
def test_a_transient_failure_is_retried_after_a_jittered_capped_backoff(eager_app: Celery, retries: int) -> None:
    eager_app.conf.task_eager_propagates = True
    task = _whole_task(eager_app, StoreUnavailableError("the shard is restarting"))
    waits = []
    for _ in range(20):
        with pytest.raises(Retry) as retry:
            task.apply(kwargs={"shard": 1}, retries=retries)
        waits.append(retry.value.when)
    assert all(0 <= wait <= min(60, 2**retries) for wait in waits)
    assert len(set(waits)) > 1  # jittered: not every message comes back at the same instant


def test_a_message_whose_dead_letter_cannot_be_recorded_goes_back_on_its_queue(eager_app: Celery) -> None:
    result = _whole_task(eager_app, InvalidEventError("bad")).apply(kwargs={"shard": 1})
    assert result.state == "REJECTED"
    assert isinstance(result.result, Reject) and result.result.requeue


def test_busy_items_the_broker_cannot_take_back_leave_the_message_on_its_queue(
    eager_app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broker_down(*_: Any, **__: Any) -> None:
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(eager_app, "send_task", broker_down)
    task = _items_task(eager_app, lambda x: DocumentBusyError(f"{x} is held") if x == 1 else None)
    result = task.apply(kwargs={"items": [0, 1]})
    # Not acknowledged with item 1 lost: the whole message runs again (item 0 as a no-op).
    assert result.state == "REJECTED"
    assert isinstance(result.result, Reject) and result.result.requeue
    assert "cannot publish" in str(result.result)
