"""The Celery app every process builds: JSON only, acknowledged after the work, routed by queue."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from celery import Celery

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.app import create_app
from shardfuse.workers.broker.serialization import control_app
from shardfuse.workers.names import Queue, Task


@pytest.mark.parametrize("build", [lambda: create_app(Settings()), lambda: control_app("redis://127.0.0.1:1/0")],
                         ids=["app", "control-app"])
def test_messages_and_results_are_json_only(build: Callable[[], Celery]) -> None:
    conf = build().conf
    assert (conf.task_serializer, conf.result_serializer) == ("json", "json")
    assert list(conf.accept_content) == ["json"] and list(conf.result_accept_content) == ["json"]
    assert conf.event_serializer == "json"
    # Every serializer or accepted-content setting the app has (Celery's defaults included) names JSON alone.
    serializer_settings = {key: conf[key] for key in conf if "serializer" in key or "accept_content" in key}
    named = {key: {value} if isinstance(value, str) else set(value) for key, value in serializer_settings.items()
             if value is not None}
    assert named and all(values == {"json"} for values in named.values()), named


def test_tasks_are_acknowledged_after_their_work_and_routed_to_their_queue() -> None:
    conf = create_app(Settings()).conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.task_routes[Task.SEARCH.value]["queue"] == Queue.QUERY.value
    assert conf.task_routes[Task.EMBED.value]["queue"] == Queue.EMBED.value
