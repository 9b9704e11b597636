"""Queue ``embed``: chunked documents, batched across documents, embedded and written to their shards
(:func:`shardfuse.pipeline.embed.message.embed_message`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardfuse.pipeline.embed.message import embed_message
from shardfuse.workers.celery_app import app
from shardfuse.workers.freshness import observe_freshness
from shardfuse.workers.logs import item_fields, log_context
from shardfuse.workers.names import Task
from shardfuse.workers.tasks.base import PipelineTask, message_items, pipeline_task

# The documents are waited for this much less than the task's soft time limit, so a stuck batch surfaces
# as a retryable failure of its documents rather than as the time limit of the whole message.
WAIT_MARGIN_S = 10.0


@pipeline_task(app, Task.EMBED)
def embed(self: PipelineTask, document: dict[str, Any] | None = None,
          documents: list[dict[str, Any]] | None = None, **unknown: Any) -> dict[str, Any]:
    """Index the documents of one message (``documents``; ``document`` is the one-document form).

    The message is acknowledged when each document has committed, failed for good (dead-lettered) or been
    handed to a retry message.
    """
    refused = self.refuse_malformed({"document": document, "documents": documents}, unknown, lists=("documents",))
    if refused is not None:
        return refused

    def work(items: Sequence[Any]) -> tuple[dict[str, Any], Sequence[tuple[Any, BaseException]]]:
        runtime = self.runtime
        wait_s = max(1.0, runtime.settings.workers.embed_limits.soft_s - WAIT_MARGIN_S)
        done = embed_message(items, leases=runtime.leases, batcher=runtime.batcher, wait_s=wait_s,
                             shards=runtime.settings.shards,
                             around=lambda raw: log_context(**item_fields(raw)))
        self.after_commits(done.committed, vector_index=True)
        self.count("indexed", done.indexed)
        observe_freshness(self.request, op="write", count=done.indexed)
        self.count("stale", done.stale)
        return {"indexed": done.indexed, "stale": done.stale, "failed": len(done.failures)}, done.failures

    return self.guarded_each("document", message_items(document, documents), work)
