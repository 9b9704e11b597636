"""Freshness (shardfuse.workers.freshness): every message carries when its change was first published, a message
sent while a task runs inherits the running message's origin, and the committing task observes the age in
``shardfuse_freshness_seconds``. Messages go through a real Celery app (in-memory broker) and its
``before_task_publish`` signal, as every shardfuse publisher's do."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish
from prometheus_client import REGISTRY

from shardfuse.workers import app as _app  # noqa: F401  connects stamp_published to before_task_publish
from shardfuse.workers.freshness import ORIGIN_HEADER, observe_freshness
from shardfuse.workers.names import PUBLISHED_HEADER


@pytest.fixture
def sent() -> Iterator[list[dict[str, Any]]]:
    """The headers of every message published during the test, as the broker receives them."""
    captured: list[dict[str, Any]] = []

    def record(headers: dict[str, Any] | None = None, **_: Any) -> None:
        captured.append(dict(headers or {}))

    before_task_publish.connect(record, weak=False)
    try:
        yield captured
    finally:
        before_task_publish.disconnect(record)


@pytest.fixture(scope="module")  # task names are process-wide in Celery: one app for the module
def celery_app() -> Celery:
    app = Celery("freshness-test", broker="memory://")

    @app.task(name="test.follow_up", bind=True, shared=False)
    def follow_up(self: Any) -> None:
        app.send_task("test.next", kwargs={})  # what an ingest task does with its documents

    return app


def test_a_message_published_from_outside_a_task_starts_its_origin_now(celery_app: Celery,
                                                                      sent: list[dict[str, Any]]) -> None:
    before = time.time()
    celery_app.send_task("test.first", kwargs={})
    (headers,) = sent
    assert before <= headers[ORIGIN_HEADER] == headers[PUBLISHED_HEADER] <= time.time()


def test_a_message_sent_while_a_task_runs_keeps_the_running_messages_origin(celery_app: Celery,
                                                                          sent: list[dict[str, Any]]) -> None:
    celery_app.tasks["test.follow_up"].apply(headers={ORIGIN_HEADER: 1000.0, PUBLISHED_HEADER: 2000.0})
    (headers,) = sent
    assert headers[ORIGIN_HEADER] == 1000.0  # the change's, not the running message's publish time
    assert headers[PUBLISHED_HEADER] > 2000.0  # the queue's age gauge still sees this message's own time


def test_a_running_message_of_an_earlier_release_lends_its_publish_time(celery_app: Celery,
                                                                      sent: list[dict[str, Any]]) -> None:
    celery_app.tasks["test.follow_up"].apply(headers={PUBLISHED_HEADER: 2000.0})
    assert sent[0][ORIGIN_HEADER] == 2000.0


@pytest.mark.parametrize("bad", ["soon", None, True, -5.0, float("nan"), [1.0]])
def test_a_malformed_origin_is_ignored_never_an_error(celery_app: Celery, sent: list[dict[str, Any]],
                                                      bad: object) -> None:
    before = time.time()
    celery_app.tasks["test.follow_up"].apply(headers={ORIGIN_HEADER: bad})
    assert before <= sent[0][ORIGIN_HEADER] <= time.time()


def test_a_sender_may_give_the_origin_itself(celery_app: Celery, sent: list[dict[str, Any]]) -> None:
    celery_app.send_task("test.first", kwargs={}, headers={ORIGIN_HEADER: 1234.5})
    assert sent[0][ORIGIN_HEADER] == 1234.5


def _freshness(op: str) -> tuple[float, float, float]:
    """The write/delete histogram's count, sum, and changes within 60 s."""
    def value(suffix: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(f"shardfuse_freshness_seconds{suffix}", {"op": op, **labels}) or 0.0
    return value("_count"), value("_sum"), value("_bucket", le="60.0")


def test_the_committing_task_observes_each_changes_age() -> None:
    count, total, fast = _freshness("write")
    request = {ORIGIN_HEADER: 1000.0, PUBLISHED_HEADER: 1100.0}
    observe_freshness(request, op="write", count=3, now=1090.0)  # 90 s after publication: over the objective
    observe_freshness(request, op="write", count=2, now=1002.0)
    after_count, after_total, after_fast = _freshness("write")
    assert after_count - count == 5
    assert after_total - total == pytest.approx(3 * 90.0 + 2 * 2.0)
    assert after_fast - fast == 2


def test_nothing_is_observed_without_an_origin_or_without_changes() -> None:
    before = _freshness("delete")
    observe_freshness({}, op="delete", count=4, now=5.0)
    observe_freshness(None, op="delete", count=4, now=5.0)
    observe_freshness({ORIGIN_HEADER: 1.0}, op="delete", count=0, now=5.0)
    assert _freshness("delete") == before
