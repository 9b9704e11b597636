"""Queue ``ingest``: write events become chunked documents for the embed stage."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from pipeline.events import parse_event
from pipeline.ingest import IngestResult, ingest_event
from workers.celery_app import app
from workers.names import Task
from workers.tasks.base import PipelineTask, leased, message_items

_limits = app.shardfuse_settings.workers.ingest_limits


@app.task(name=Task.INGEST.value, bind=True, base=PipelineTask,
          soft_time_limit=_limits.soft_s, time_limit=_limits.hard_s)
def ingest(self: PipelineTask, event: Any = None, events: list[Any] | None = None,
           refresh: bool = False, **unknown: Any) -> dict[str, Any]:
    """Ingest the events of one message (``events``; ``event`` is the one-event form). ``refresh``
    re-indexes the seq a shard holds (``shardfuse backfill-context``).

    The documents they produce go on to the embed stage together, in one message: the publisher's grouping
    of events carries through, and the embed workers receive documents by the dozen, not one at a time.
    Each event is worked on under its document's lease (:mod:`pipeline.leases`); the embed stage takes its
    own when the document reaches it.
    """

    def work(items: Sequence[Any]) -> tuple[dict[str, Any], list[tuple[Any, BaseException]]]:
        runtime = self.runtime
        failures: list[tuple[Any, BaseException]] = []
        documents: list[dict[str, Any]] = []
        results: Counter[str] = Counter()
        unchanged_shards: set[int] = set()
        for raw in items:
            try:
                event = parse_event(raw)
                with leased(runtime.leases, event.zone, event.path) as lease:
                    outcome = ingest_event(event, settings=runtime.settings, cas=runtime.cas,
                                           stores=runtime.stores, counter=runtime.counter,
                                           contextualizer=runtime.contextualizer, registry=runtime.chunk_registry,
                                           refresh=refresh, fence=lease.token)
            except Exception as exc:  # noqa: BLE001 - settled per event by guarded_each
                failures.append((raw, exc))
                continue
            results[outcome.result.value] += 1
            if outcome.document is not None:
                documents.append(outcome.document.to_dict())
            elif outcome.result in (IngestResult.DELETED, IngestResult.SKIPPED):
                unchanged_shards.add(outcome.shard)
        if documents:
            self.app.send_task(Task.EMBED.value, kwargs={"documents": documents})
        for shard in sorted(unchanged_shards):
            self.schedule_bm25(shard)
        return dict(results), failures

    arguments = {"event": event, "events": events, "refresh": refresh}
    refused = self.refuse_malformed(arguments, unknown, lists=("events",))
    if refused is not None:
        return refused
    return self.guarded_each("event", message_items(event, events), work, carry={"refresh": bool(refresh)})
