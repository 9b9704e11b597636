"""Queue ``ingest``: write events become chunked documents for the embed stage
(:func:`shardfuse.pipeline.ingest.message.ingest_message`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardfuse.pipeline.ingest.message import IngestPorts, ingest_message
from shardfuse.pipeline.ingest.stage import IngestResult
from shardfuse.workers.celery_app import app
from shardfuse.workers.freshness import observe_freshness
from shardfuse.workers.logs import log_context
from shardfuse.workers.names import Task
from shardfuse.workers.tasks.base import PipelineTask, message_items, pipeline_task


@pipeline_task(app, Task.INGEST)
def ingest(self: PipelineTask, event: Any = None, events: list[Any] | None = None,
           refresh: bool = False, **unknown: Any) -> dict[str, Any]:
    """Ingest the events of one message (``events``; ``event`` is the one-event form). ``refresh``
    re-indexes the seq a shard holds (``shardfuse backfill-context``).

    The documents they produce go on to the embed stage together, in one message: the publisher's grouping
    of events carries through, and the embed workers receive documents by the dozen, not one at a time.
    Deletes and skips need no embedding: their shards' BM25 updates are scheduled here.
    """
    refused = self.refuse_malformed({"event": event, "events": events, "refresh": refresh}, unknown,
                                    lists=("events",))
    if refused is not None:
        return refused

    def work(items: Sequence[Any]) -> tuple[dict[str, Any], Sequence[tuple[Any, BaseException]]]:
        runtime = self.runtime
        ports = IngestPorts(settings=runtime.settings, cas=runtime.cas, stores=runtime.stores, counter=runtime.counter,
                            leases=runtime.leases, contextualizer=runtime.contextualizer,
                            registry=runtime.chunk_registry)
        done = ingest_message(items, ports=ports, refresh=bool(refresh),
                              around=lambda e: log_context(event_id=e.event_id, zone=e.zone))
        if done.documents:
            self.publish(Task.EMBED.value, {"documents": [document.to_dict() for document in done.documents]})
        self.after_commits(done.unchanged)
        for result, count in done.counts.items():
            self.count(result, count)
        observe_freshness(self.request, op="delete", count=done.counts.get(IngestResult.DELETED, 0))
        return dict(done.counts), done.failures

    return self.guarded_each("event", message_items(event, events), work, carry={"refresh": bool(refresh)})
