"""Queue ``maintenance``: BM25 shard updates (delta segments) and merges, and HNSW index builds after bulk
loads (:mod:`shardfuse.pipeline.index.maintenance`)."""

from __future__ import annotations

import os
from typing import Any

from shardfuse.pipeline.index.maintenance import (
    LoadState,
    VectorIndexResult,
    build_deferred_vector_indexes,
    shard_indexer,
    update_bm25,
)
from shardfuse.workers.celery_app import app
from shardfuse.workers.names import Task
from shardfuse.workers.tasks.base import PipelineTask, pipeline_task


@pipeline_task(app, Task.BM25_REBUILD)
def bm25_rebuild(self: PipelineTask, shard: int = -1, merge: bool = False, **unknown: Any) -> dict[str, Any]:
    """Bring a shard's BM25 index up to date: a delta segment of the documents written since its generation
    (``merge=False``, after commits), or a full rebuild into a new generation (``merge=True``, scheduled once
    the delta grew past ``bm25.delta_max_chunks`` or aged past ``bm25.merge_after_s``)."""
    refused = self.refuse_malformed({"shard": shard, "merge": merge}, unknown, shard="shard")
    if refused is not None:
        return refused

    def work() -> dict[str, Any]:
        runtime = self.runtime
        indexer = shard_indexer(runtime.settings, shard, store=runtime.stores[shard], freshness=runtime.freshness,
                                tokenizer=runtime.lexical_tokenizer)
        store = runtime.stores[shard]
        load = LoadState(loading=lambda: runtime.pending_documents() > 0, deferred=store.vector_index_deferred)
        update = update_bm25(indexer, claims=runtime.freshness, merge=bool(merge),
                             rebuild_debounce_s=runtime.settings.bm25.rebuild_debounce_s,
                             load=load, pacing=runtime.freshness)
        if update.merge_in_s is not None:
            self.publish(Task.BM25_REBUILD.value, {"shard": shard, "merge": True}, countdown=update.merge_in_s)
        if update.update_in_s is not None:
            self.publish(Task.BM25_REBUILD.value, {"shard": shard}, countdown=update.update_in_s)
        return update.result

    return self.guarded({"shard": shard, "merge": merge}, work)


@pipeline_task(app, Task.VECTOR_INDEX_BUILD)
def vector_index_build(self: PipelineTask, shard: int = -1, **unknown: Any) -> dict[str, Any]:
    """Build the indexes a bulk load deferred, once the load is over (the queues are empty): every deferred
    shard's at once; until then check again every ``vector_index.build_debounce_s``."""
    refused = self.refuse_malformed({"shard": shard}, unknown, shard="shard")
    if refused is not None:
        return refused

    def work() -> dict[str, Any]:
        runtime = self.runtime
        # Every shard whose load deferred its indexes builds now, side by side (the other shards' own build
        # messages then find them present).
        steps = build_deferred_vector_indexes(runtime.stores, pending_documents=runtime.pending_documents,
                                              clear_schedule=self.clear_vector_index_schedule,
                                              cores=os.cpu_count() or 1)
        step = steps[shard]
        if step.result is VectorIndexResult.WAITING:
            self.publish(self.name, {"shard": shard}, countdown=runtime.settings.vector_index.build_debounce_s)
            return step.as_dict(shard)
        return {**step.as_dict(shard), "shards": [s.as_dict(n) for n, s in steps.items()]}

    return self.guarded({"shard": shard}, work)
