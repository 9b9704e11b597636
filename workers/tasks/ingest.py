"""Queue ``ingest``: a write event becomes a chunked document for the embed stage."""

from __future__ import annotations

from typing import Any

from pipeline.events import parse_event
from pipeline.ingest import IngestResult, ingest_event
from workers.celery_app import app
from workers.names import Task
from workers.tasks.base import PipelineTask

_limits = app.shardfuse_settings.workers.ingest_limits


@app.task(name=Task.INGEST.value, bind=True, base=PipelineTask,
          soft_time_limit=_limits.soft_s, time_limit=_limits.hard_s)
def ingest(self: PipelineTask, event: Any) -> dict[str, Any]:
    payload = {"event": event}

    def work() -> dict[str, Any]:
        runtime = self.runtime
        outcome = ingest_event(
            parse_event(event),
            settings=runtime.settings,
            cas=runtime.cas,
            stores=runtime.stores,
            counter=runtime.counter,
        )
        if outcome.document is not None:
            self.app.send_task(Task.EMBED.value, kwargs={"document": outcome.document.to_dict()})
        elif outcome.result in (IngestResult.DELETED, IngestResult.SKIPPED):
            self.schedule_bm25(outcome.shard)
        return {"result": outcome.result.value, "shard": outcome.shard, "reason": outcome.reason}

    return self.guarded(payload, work)
