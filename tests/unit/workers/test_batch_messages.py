"""Messages of several events or documents: grouped by the publisher, settled item by item by the workers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Reject, Retry

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import DocumentBusyError, InvalidEventError, StoreUnavailableError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.workers.app import create_app
from shardfuse.workers.names import Task
from shardfuse.workers.publishing import CeleryEventSink
from shardfuse.workers.tasks import base
from shardfuse.workers.tasks.base import PipelineTask, message_items


class _RecordingApp:
    """Stands in for the Celery app in the sink: records what would be published."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def send_task(self, name: str, *, kwargs: dict[str, Any], producer: Any, **options: Any) -> None:
        from kombu.exceptions import OperationalError

        if self.fail:
            raise OperationalError("broker gone")
        self.sent.append((name, kwargs))


def _event(i: int) -> WriteEvent:
    return WriteEvent(op=Op.DELETE, zone="z", path=f"p{i}.txt", seq=i + 1)


def test_the_sink_packs_events_into_messages_and_flushes_the_rest() -> None:
    app = _RecordingApp()
    sink = CeleryEventSink(app, producer=None, events_per_message=4)  # type: ignore[arg-type]
    for i in range(10):
        sink.send(_event(i))
    assert [len(kw["events"]) for _, kw in app.sent] == [4, 4]
    sink.flush()
    assert [len(kw.get("events", [kw.get("event")])) for _, kw in app.sent] == [4, 4, 2]
    assert all(name == Task.INGEST.value for name, _ in app.sent)
    paths = [e["path"] for _, kw in app.sent for e in kw["events"]]
    assert paths == [f"p{i}.txt" for i in range(10)]  # every event once, in order
    sink.flush()
    assert len(app.sent) == 3 and sink.messages == 3


def test_a_lone_event_travels_in_the_one_event_form() -> None:
    app = _RecordingApp()
    sink = CeleryEventSink(app, producer=None, events_per_message=16)  # type: ignore[arg-type]
    event = _event(0)
    sink.send(event)
    sink.flush()
    assert app.sent == [(Task.INGEST.value, {"event": event.model_dump(mode="json")})]


def test_events_that_could_not_be_published_are_kept_for_the_next_flush() -> None:
    app = _RecordingApp(fail=True)
    sink = CeleryEventSink(app, producer=None, events_per_message=2)  # type: ignore[arg-type]
    sink.send(_event(0))
    with pytest.raises(StoreUnavailableError, match="cannot publish"):
        sink.send(_event(1))
    app.fail = False
    sink.flush()
    assert [e["path"] for e in app.sent[0][1]["events"]] == ["p0.txt", "p1.txt"]


def test_events_per_message_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        CeleryEventSink(_RecordingApp(), producer=None, events_per_message=0)  # type: ignore[arg-type]


def test_message_items_accepts_the_one_and_the_many_form() -> None:
    assert message_items({"a": 1}, None) == [{"a": 1}]
    assert message_items(None, [1, 2]) == [1, 2]
    assert message_items(None, None) == []


@pytest.fixture
def eager_app() -> Celery:
    app = create_app(Settings())
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    return app


def test_only_the_items_that_failed_are_retried_and_the_rest_stay_done(eager_app: Celery) -> None:
    calls: list[list[int]] = []
    done: list[int] = []

    @eager_app.task(name="test.batch", bind=True, base=PipelineTask, shared=False)
    def batch(self: PipelineTask, item: int | None = None, items: list[int] | None = None) -> dict[str, Any]:
        def work(xs: Sequence[int]) -> tuple[dict[str, Any], list[tuple[Any, BaseException]]]:
            calls.append(list(xs))
            failures: list[tuple[Any, BaseException]] = []
            for x in xs:
                # Odd items fail on the first two attempts with a transient error.
                if x % 2 and self.request.retries < 2:
                    failures.append((x, ConnectionError(f"item {x}: try again")))
                else:
                    done.append(x)
            return {"done": len(xs) - len(failures)}, failures

        return self.guarded_each("item", message_items(item, items), work)

    kwargs: dict[str, Any] = {"items": [0, 1, 2, 3, 4]}
    for attempt in range(5):  # what the broker would deliver: the original, then each retry message
        try:
            batch.apply(kwargs=kwargs, retries=attempt)
            break
        except Retry as retry:
            assert retry.sig is not None
            kwargs = retry.sig.kwargs
    assert calls == [[0, 1, 2, 3, 4], [1, 3], [1, 3]]
    assert sorted(done) == [0, 1, 2, 3, 4]  # each item done exactly once


def _batch_task(app: Celery, failures_for: Any) -> Any:
    @app.task(name="test.settle", bind=True, base=PipelineTask, shared=False)
    def settle(self: PipelineTask, item: int | None = None, items: list[int] | None = None) -> dict[str, Any]:
        def work(xs: Sequence[int]) -> tuple[dict[str, Any], list[tuple[Any, BaseException]]]:
            failures = [(x, failures_for(x)) for x in xs if failures_for(x) is not None]
            return {"done": len(xs) - len(failures)}, failures

        return self.guarded_each("item", message_items(item, items), work)

    return settle


def test_documents_another_worker_holds_go_back_without_spending_the_retry_budget(
    eager_app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, dict[str, Any], float]] = []
    monkeypatch.setattr(eager_app, "send_task",
                        lambda name, kwargs, countdown, **_: sent.append((name, kwargs, countdown)))
    task = _batch_task(eager_app, lambda x: DocumentBusyError(f"{x} is held") if x in (1, 2) else None)
    # On the last attempt the retry budget is spent, yet busy items are not dead-lettered: they wait.
    result = task.apply(kwargs={"items": [0, 1, 2, 3]}, retries=eager_app.shardfuse_settings.workers.max_retries)
    assert result.get() == {"done": 2, "dead_letters": 0, "busy": 2}
    assert sent == [("test.settle", {"items": [1, 2]}, eager_app.shardfuse_settings.delivery.busy_retry_s)]


def test_a_message_whose_failure_cannot_be_recorded_goes_back_on_its_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    # The dead-letter table lives in a PostgreSQL that is down (nothing listens on port 1).
    app = create_app(Settings(postgres={"dsn": "postgresql://postgres@127.0.0.1:1/down"}))
    app.conf.task_always_eager = True
    monkeypatch.setattr(base, "REQUEUE_PAUSE_S", 0)
    task = _batch_task(app, lambda x: InvalidEventError("bad") if x == 1 else None)
    result = task.apply(kwargs={"items": [0, 1]})
    # Not acknowledged as done: rejected with requeue, so the whole message runs again (item 0 as a no-op).
    assert result.state == "REJECTED"
    assert isinstance(result.result, Reject) and result.result.requeue
    assert "PostgreSQL" in str(result.result) and "127.0.0.1" in str(result.result)
