"""Every task's soft and hard time limits come from the settings of the app it runs in (Celery's
``task_annotations``, applied when a task binds to an app), never from settings read at import."""

from __future__ import annotations

import importlib

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.app import TASK_MODULES, create_app
from shardfuse.workers.names import Task

LIMITS = {"ingest_limits": (11, 13), "embed_limits": (21, 23), "maintenance_limits": (31, 33),
          "query_limits": (5, 7)}
EXPECTED = {Task.INGEST: LIMITS["ingest_limits"], Task.EMBED: LIMITS["embed_limits"],
            Task.BM25_REBUILD: LIMITS["maintenance_limits"], Task.VECTOR_INDEX_BUILD: LIMITS["maintenance_limits"],
            Task.SEARCH: LIMITS["query_limits"]}


def test_a_workers_tasks_take_the_time_limits_of_its_own_settings() -> None:
    # The task modules register their tasks with every app; importing them builds the default workers' app
    # from this process's (default) settings first.
    for module in TASK_MODULES:
        importlib.import_module(module)
    settings = Settings(workers={name: {"soft_s": soft, "hard_s": hard} for name, (soft, hard) in LIMITS.items()},
                        ingest={"document_deadline_s": 5})  # must stay under the ingest soft limit
    app = create_app(settings)
    default_app = create_app(Settings())
    for name, (soft, hard) in EXPECTED.items():
        task = app.tasks[name.value]
        assert task.app is app
        # What the worker's pool enforces for a message that names no limits of its own.
        assert (task.soft_time_limit, task.time_limit) == (soft, hard), name
        assert (default_app.tasks[name.value].soft_time_limit, default_app.tasks[name.value].time_limit) != (soft, hard)
    assert default_app.tasks[Task.INGEST.value].soft_time_limit == Settings().workers.ingest_limits.soft_s


def test_searches_send_task_events_only_when_the_settings_turn_them_on() -> None:
    for module in TASK_MODULES:
        importlib.import_module(module)
    loud = create_app(Settings(workers={"search_events": True}))
    default = create_app(Settings())
    # What the worker checks before sending task-received, task-started and task-succeeded for a message.
    assert default.tasks[Task.SEARCH.value].send_events is False
    assert all(default.tasks[task.value].send_events is True for task in Task if task is not Task.SEARCH)
    assert all(loud.tasks[task.value].send_events is True for task in Task)
