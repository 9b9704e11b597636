"""Queue ``embed``: chunked documents, batched across documents, embedded and written to their shards."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from shardfuse.pipeline.coordination.leases import Lease
from shardfuse.pipeline.core.documents import PreparedDocument
from shardfuse.pipeline.core.errors import LeaseLostError
from shardfuse.pipeline.index.store import ApplyOutcome
from shardfuse.workers.celery_app import app
from shardfuse.workers.logs import item_fields, log_context
from shardfuse.workers.names import Task
from shardfuse.workers.tasks.base import PipelineTask, message_items, take_lease

_limits = app.shardfuse_settings.workers.embed_limits


@app.task(name=Task.EMBED.value, bind=True, base=PipelineTask,
          soft_time_limit=_limits.soft_s, time_limit=_limits.hard_s)
def embed(self: PipelineTask, document: dict[str, Any] | None = None,
          documents: list[dict[str, Any]] | None = None, **unknown: Any) -> dict[str, Any]:
    """Index the documents of one message (``documents``; ``document`` is the one-document form).

    Every document goes to the process's batcher at once, so one message's documents share requests and
    shard transactions with each other and with other messages'. Each is held under its document lease,
    whose fencing token the shard checks at the write. The message is acknowledged when each document has
    committed, failed for good (dead-lettered) or been handed to a retry message.
    """

    def work(items: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], list[tuple[Any, BaseException]]]:
        leases = self.runtime.leases
        failures: list[tuple[Any, BaseException]] = []
        pending: list[tuple[dict[str, Any], PreparedDocument, Lease, Future[ApplyOutcome]]] = []
        for raw in items:
            try:
                with log_context(**item_fields(raw)):
                    prepared = PreparedDocument.from_dict(raw)
                    lease = take_lease(leases, prepared.event.zone, prepared.event.path)
            except Exception as exc:  # noqa: BLE001 - a malformed or busy document fails alone
                failures.append((raw, exc))
                continue
            pending.append((raw, prepared, lease, self.runtime.batcher.submit(prepared, fence=lease.token)))
        # Wait a little less than the soft limit so a stuck batch surfaces as a retryable timeout.
        deadline = time.monotonic() + max(1.0, _limits.soft_s - 10)
        indexed = stale = 0
        shards: dict[int, list[tuple[str, str]]] = {}
        for raw, prepared, lease, future in pending:
            with log_context(**item_fields(raw)):
                try:
                    outcome = future.result(timeout=max(0.0, deadline - time.monotonic()))
                    if outcome.fenced:
                        leases.raise_floor(outcome.stored_fence)
                        raise LeaseLostError.fenced(stored_fence=outcome.stored_fence, carried=lease.token)
                except Exception as exc:  # noqa: BLE001 - settled per document by guarded_each
                    failures.append((raw, exc))
                    continue
                finally:
                    # After a timeout the batcher may still write the document: its token then loses to the
                    # retry's newer one, or the retry finds the seq already applied.
                    leases.release(lease)
            if outcome.applied:
                indexed += 1
                shards.setdefault(prepared.shard, []).append(prepared.event.key)
            else:
                stale += 1
        for shard, keys in sorted(shards.items()):
            self.schedule_bm25(shard, keys)  # only this shard's documents go into its next delta
            if self.runtime.bulk_load_gate.deferred(shard):
                self.schedule_vector_index(shard)
        self.count("indexed", indexed)
        self.count("stale", stale)
        return {"indexed": indexed, "stale": stale, "failed": len(failures)}, failures

    refused = self.refuse_malformed({"document": document, "documents": documents}, unknown, lists=("documents",))
    if refused is not None:
        return refused
    return self.guarded_each("document", message_items(document, documents), work)
