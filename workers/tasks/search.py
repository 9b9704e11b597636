"""Queue ``query``: the thin RPC task ``shardfuse.search``.

Its arguments are :class:`shardfuse.query.request.SearchRequest`'s fields; its time limits are the
``workers.query_limits`` of the settings its app was built with (``task_annotations``, workers/app.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Task as CeleryTask

from shardfuse.pipeline.core import failpoints
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.core.failpoints import Failpoint
from shardfuse.pipeline.observability import metrics
from shardfuse.query.request import Mode, parse_request
from shardfuse.workers import replies
from shardfuse.workers.celery_app import app
from shardfuse.workers.names import Task

_MODES = frozenset(m.value for m in Mode)


@contextmanager
def _timed(mode: Any) -> Iterator[dict[str, str]]:
    """Observe the block's duration in the ``query_duration_seconds`` histogram, by mode and outcome: what
    the block sets as ``outcome`` (``ok``, ``cached``), else ``invalid`` for a refused request, ``error``."""
    labels = {"mode": mode if isinstance(mode, str) and mode in _MODES else "other", "outcome": "error"}
    started = time.perf_counter()
    try:
        yield labels
    except InvalidQueryError:
        labels["outcome"] = "invalid"
        raise
    finally:
        metrics.observe(metrics.QUERY_DURATION, time.perf_counter() - started, **labels)


# Celery's decorator is untyped; the task it makes is called by name through the broker, not from typed code.
@app.task(name=Task.SEARCH.value, bind=True)  # type: ignore[untyped-decorator]
def search(self: CeleryTask, **arguments: Any) -> dict[str, Any]:
    """Validate, fan out to every shard, fuse. Errors reach the caller as the task's exception: a bad or
    unknown argument is an :class:`InvalidQueryError` saying which (and, for an unknown one, the arguments
    the task takes), never a ``TypeError`` from the worker's call. A :class:`SearchClient`'s search gets its
    answer or error on its reply list (workers/replies.py); any other caller's, from the result backend."""
    address = replies.address_of(self.request.reply_to)
    if address is None:
        return _search(self, arguments)
    try:
        answer = _search(self, arguments)
    except Exception as exc:
        replies.send_failure(self.app.backend.client, address, exc)
        raise
    replies.send(self.app.backend.client, address, replies.success(answer))
    return answer


def _search(self: CeleryTask, arguments: dict[str, Any]) -> dict[str, Any]:
    with _timed(arguments.get("mode", Mode.HYBRID.value)) as timing:
        runtime = self.app.shardfuse_runtime.get()
        failpoints.reach(Failpoint.SEARCH_STARTED, runtime.settings.failpoints)
        request = parse_request(arguments, settings=runtime.settings.query)
        answer: dict[str, Any] = runtime.searcher.search(request)
        timing["outcome"] = "cached" if answer.get("cache") == "hit" else "ok"
        return answer
