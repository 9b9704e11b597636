"""``shardfuse_ready``: a Celery remote-control command answering whether a worker can serve its queues
completely — for a query worker, whether it has fetched every shard's published BM25 index (a node that
starts with an empty cache answers pings before that). ``shardfuse ping`` asks it after the plain ping."""

from __future__ import annotations

from typing import Any

from celery.worker.control import inspect_command

COMMAND = "shardfuse_ready"


@inspect_command(name=COMMAND)  # type: ignore[untyped-decorator]  # celery's decorators are untyped
def shardfuse_ready(state: Any, **_: Any) -> dict[str, Any]:
    """This worker process's readiness (:meth:`shardfuse.workers.runtime.RuntimeHolder.readiness`)."""
    holder = getattr(state.consumer.app, "shardfuse_runtime", None)
    if holder is None:
        return {"ready": None}
    return dict(holder.readiness())
