"""Queue ``maintenance``: BM25 shard rebuilds, and HNSW index builds after bulk loads."""

from __future__ import annotations

import time
from typing import Any

from pipeline.lexical import build_shard_index
from workers.celery_app import app
from workers.names import Task
from workers.tasks.base import VECTOR_INDEX_FLAG, PipelineTask

_limits = app.shardfuse_settings.workers.maintenance_limits


@app.task(name=Task.BM25_REBUILD.value, bind=True, base=PipelineTask,
          soft_time_limit=_limits.soft_s, time_limit=_limits.hard_s)
def bm25_rebuild(self: PipelineTask, shard: int) -> dict[str, Any]:
    payload = {"shard": shard}

    def work() -> dict[str, Any]:
        runtime = self.runtime
        settings = runtime.settings
        # Read the version before the snapshot: everything committed up to it is in the snapshot.
        started = time.monotonic()
        version = runtime.freshness.begin_rebuild(shard)
        ids: list[str] = []
        zones: list[str] = []
        texts: list[str] = []
        for chunk_id, zone, text in runtime.stores[shard].iter_lexical_rows():
            ids.append(chunk_id)
            zones.append(zone)
            texts.append(text)
        manifest = build_shard_index(
            settings.bm25_root,
            shard,
            chunk_ids=ids,
            zones=zones,
            texts=texts,
            built_version=version,
            k1=settings.bm25.k1,
            b=settings.bm25.b,
            keep_generations=settings.bm25.keep_generations,
            tokenizer=runtime.lexical_tokenizer,
        )
        runtime.freshness.record_build(shard, seconds=time.monotonic() - started)
        return {"shard": shard, "generation": manifest.generation, "documents": manifest.doc_count,
                "built_version": version}

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
