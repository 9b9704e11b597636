"""Queue ``embed``: chunked documents, batched across documents, embedded and written to their shards."""

from __future__ import annotations

from typing import Any

from pipeline.models import PreparedDocument
from workers.celery_app import app
from workers.names import Task
from workers.tasks.base import PipelineTask

_limits = app.shardfuse_settings.workers.embed_limits


@app.task(name=Task.EMBED.value, bind=True, base=PipelineTask,
          soft_time_limit=_limits.soft_s, time_limit=_limits.hard_s)
def embed(self: PipelineTask, document: dict[str, Any]) -> dict[str, Any]:
    payload = {"document": document}

    def work() -> dict[str, Any]:
        prepared = PreparedDocument.from_dict(document)
        # Wait a little less than the soft limit so a stuck batch surfaces as a retryable timeout.
        outcome = self.runtime.batcher.index(prepared, timeout=max(1.0, _limits.soft_s - 10))
        if outcome.applied:
            self.schedule_bm25(prepared.shard)
        return {"result": "indexed" if outcome.applied else "stale", "shard": prepared.shard,
                "chunks": len(prepared.chunks)}

    return self.guarded(payload, work)
