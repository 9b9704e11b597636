"""Queue ``ingest``: write events become chunked documents for the embed stage."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shardfuse.pipeline.core.events import WriteEvent, parse_event
from shardfuse.pipeline.ingest.stage import IngestOutcome, IngestResult, held_seqs, ingest_event
from shardfuse.workers.celery_app import app
from shardfuse.workers.logs import log_context, log_fields
from shardfuse.workers.names import Task
from shardfuse.workers.tasks.base import PipelineTask, leased, message_items

_limits = app.shardfuse_settings.workers.ingest_limits
# Events of one message worked on at once (each on its own document).
EVENT_THREADS = 4
Outcome = IngestOutcome | BaseException


@app.task(name=Task.INGEST.value, bind=True, base=PipelineTask,
          soft_time_limit=_limits.soft_s, time_limit=_limits.hard_s)
def ingest(self: PipelineTask, event: Any = None, events: list[Any] | None = None,
           refresh: bool = False, **unknown: Any) -> dict[str, Any]:
    """Ingest the events of one message (``events``; ``event`` is the one-event form). ``refresh``
    re-indexes the seq a shard holds (``shardfuse backfill-context``).

    The documents they produce go on to the embed stage together, in one message: the publisher's grouping
    of events carries through, and the embed workers receive documents by the dozen, not one at a time.
    Each event is worked on under its document's lease (:mod:`shardfuse.pipeline.coordination.leases`); the embed stage
    takes its
    own when the document reaches it. The message's early version check is one query per shard, and up to
    ``EVENT_THREADS`` documents are worked on at once (an event mostly waits on Redis and PostgreSQL).
    """

    def work(items: Sequence[Any]) -> tuple[dict[str, Any], list[tuple[Any, BaseException]]]:
        runtime = self.runtime
        failures: list[tuple[Any, BaseException]] = []
        # Events of one document stay in order, on one thread (its lease is the document's).
        groups: dict[tuple[str, str], list[tuple[Any, WriteEvent]]] = {}
        for raw in items:
            try:
                event = parse_event(raw)
            except Exception as exc:  # noqa: BLE001 - settled per event by guarded_each
                failures.append((raw, exc))
                continue
            groups.setdefault(event.key, []).append((raw, event))
        try:  # the early version check of the whole message, one query per shard
            held: dict[tuple[str, str], int] | None = held_seqs(
                [e for group in groups.values() for _, e in group], stores=runtime.stores,
                shards=runtime.settings.shards)
        except Exception:  # noqa: BLE001 - only an optimisation: each event then asks its shard itself
            held = None

        task_fields = log_fields()  # this thread's (the task's): the event threads log with it too

        def one_document(group: list[tuple[Any, WriteEvent]]) -> list[tuple[Any, WriteEvent, Outcome]]:
            done: list[tuple[Any, WriteEvent, Outcome]] = []
            for raw, event in group:
                try:
                    with log_context(**task_fields, event_id=event.event_id, zone=event.zone), \
                            leased(runtime.leases, event.zone, event.path) as lease:
                        done.append((raw, event, ingest_event(
                            event, settings=runtime.settings, cas=runtime.cas, stores=runtime.stores,
                            counter=runtime.counter, contextualizer=runtime.contextualizer,
                            registry=runtime.chunk_registry, refresh=refresh, fence=lease.token, held_seqs=held)))
                except Exception as exc:  # noqa: BLE001 - settled per event by guarded_each
                    done.append((raw, event, exc))
            return done

        # Most of an event's time is waiting on Redis (its lease) and PostgreSQL: overlap a few.
        if len(groups) > 1:
            with ThreadPoolExecutor(max_workers=min(EVENT_THREADS, len(groups)),
                                    thread_name_prefix="ingest-event") as pool:
                results = [r for done in pool.map(one_document, groups.values()) for r in done]
        else:
            results = [r for group in groups.values() for r in one_document(group)]

        documents: list[dict[str, Any]] = []
        counts: Counter[str] = Counter()
        unchanged_shards: dict[int, list[tuple[str, str]]] = {}
        for raw, event, outcome in results:
            if isinstance(outcome, BaseException):
                failures.append((raw, outcome))
                continue
            counts[outcome.result.value] += 1
            if outcome.document is not None:
                documents.append(outcome.document.to_dict())
            elif outcome.result in (IngestResult.DELETED, IngestResult.SKIPPED):
                unchanged_shards.setdefault(outcome.shard, []).append(event.key)
        if documents:
            self.app.send_task(Task.EMBED.value, kwargs={"documents": documents})
        for shard, keys in sorted(unchanged_shards.items()):
            self.schedule_bm25(shard, keys)
        for result, count in counts.items():
            self.count(result, count)
        return dict(counts), failures

    arguments = {"event": event, "events": events, "refresh": refresh}
    refused = self.refuse_malformed(arguments, unknown, lists=("events",))
    if refused is not None:
        return refused
    return self.guarded_each("event", message_items(event, events), work, carry={"refresh": bool(refresh)})
