"""Queue ``query``: the thin RPC task ``shardfuse.search``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Task as CeleryTask

from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.core.events import quoted
from shardfuse.pipeline.observability import metrics
from shardfuse.query.request import Mode, SearchRequest
from shardfuse.workers.celery_app import app
from shardfuse.workers.names import Task

_settings = app.shardfuse_settings
_limits = _settings.workers.query_limits
_ARGUMENTS = ("query", "zone", "k", "mode", "fusion", "alpha", "rrf_k", "path_prefix", "filters", "cache", "boost",
              "route", "expand", "model")
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


@app.task(name=Task.SEARCH.value, bind=True, soft_time_limit=_limits.soft_s, time_limit=_limits.hard_s)
def search(
    self: CeleryTask,
    query: Any = None,
    zone: Any = None,
    k: Any = 10,
    mode: Any = "hybrid",
    fusion: Any = None,
    alpha: Any = None,
    rrf_k: Any = None,
    path_prefix: Any = None,
    filters: Any = None,
    cache: Any = True,
    boost: Any = None,
    route: Any = None,
    expand: Any = None,
    model: Any = None,
    **unknown: Any,
) -> dict[str, Any]:
    """Validate, fan out to every shard, fuse. Errors reach the caller as the task's exception: a request
    naming an argument the task does not take gets an :class:`InvalidQueryError` saying which, not a
    ``TypeError`` from the worker's call."""
    with _timed(mode) as timing:
        if unknown:
            raise InvalidQueryError(f"unknown search argument(s) {', '.join(sorted(map(quoted, unknown)))}; "
                                    f"the task takes {', '.join(_ARGUMENTS)}")
        default_fusion, default_alpha = _settings.query.fusion_defaults(zone)
        request = SearchRequest.parse(query=query, zone=zone, k=k, mode=mode, fusion=fusion or default_fusion,
                                      alpha=default_alpha if alpha is None else alpha,
                                      rrf_k=rrf_k, path_prefix=path_prefix, filters=filters,
                                      boost=boost, route=route, expand=expand, model=model,
                                      max_k=_settings.query.max_k)
        searcher = self.app.shardfuse_runtime.get().searcher
        answer: dict[str, Any] = searcher.search(request, use_cache=bool(cache))
        timing["outcome"] = "cached" if answer.get("cache") == "hit" else "ok"
        return answer
