"""Queue ``maintenance``: BM25 shard updates (delta segments) and merges, and HNSW index builds after bulk loads."""

from __future__ import annotations

from typing import Any

from shardfuse.pipeline.index.lexical.updates import ShardIndexer
from shardfuse.workers.celery_app import app
from shardfuse.workers.names import Task
from shardfuse.workers.tasks.base import VECTOR_INDEX_FLAG, PipelineTask

_limits = app.shardfuse_settings.workers.maintenance_limits


@app.task(name=Task.BM25_REBUILD.value, bind=True, base=PipelineTask,
          soft_time_limit=_limits.soft_s, time_limit=_limits.hard_s)
def bm25_rebuild(self: PipelineTask, shard: int, merge: bool = False) -> dict[str, Any]:
    """Bring a shard's BM25 index up to date: a delta segment of the documents written since its generation
    (``merge=False``, after commits), or a full rebuild into a new generation (``merge=True``, scheduled once
    the delta grew past ``bm25.delta_max_chunks`` or aged past ``bm25.merge_after_s``)."""
    payload = {"shard": shard, "merge": merge}

    def work() -> dict[str, Any]:
        runtime = self.runtime
        settings = runtime.settings
        indexer = ShardIndexer(
            root=settings.bm25_root, shard=shard, store=runtime.stores[shard], freshness=runtime.freshness,
            tokenizer=runtime.lexical_tokenizer, k1=settings.bm25.k1, b=settings.bm25.b,
            keep_generations=settings.bm25.keep_generations, delta_max_chunks=settings.bm25.delta_max_chunks,
            merge_after_s=settings.bm25.merge_after_s,
        )
        if merge:
            try:
                return indexer.merge()
            finally:
                runtime.freshness.release_merge(shard)
        result = indexer.update()
        if result["merge_due"] and runtime.freshness.claim_merge(shard):
            delay = runtime.freshness.rebuild_delay(shard, debounce_s=settings.bm25.rebuild_debounce_s)
            self.app.send_task(Task.BM25_REBUILD.value, kwargs={"shard": shard, "merge": True}, countdown=delay)
        return result

    return self.guarded(payload, work)


@app.task(name=Task.VECTOR_INDEX_BUILD.value, bind=True, base=PipelineTask,
          soft_time_limit=_limits.soft_s, time_limit=_limits.hard_s)
def vector_index_build(self: PipelineTask, shard: int) -> dict[str, Any]:
    """Build the HNSW index a bulk load deferred, once the load is over (the queues are empty); until then
    check again every ``vector_index.build_debounce_s``."""
    payload = {"shard": shard}

    def work() -> dict[str, Any]:
        runtime = self.runtime
        pending = runtime.pending_documents()
        if pending:
            self.apply_async(kwargs={"shard": shard}, countdown=runtime.settings.vector_index.build_debounce_s)
            return {"shard": shard, "result": "waiting", "pending_documents": pending}
        # Cleared first: a write that lands during the build schedules another, which finds nothing to do.
        runtime.redis.delete(f"{VECTOR_INDEX_FLAG}:{shard}")
        store = runtime.stores[shard]
        if not store.vector_index_deferred():
            return {"shard": shard, "result": "present"}
        seconds = store.build_vector_index()
        return {"shard": shard, "result": "built" if seconds is not None else "building elsewhere",
                "seconds": seconds}

    return self.guarded(payload, work)
