"""Queue ``maintenance``: BM25 shard rebuilds."""

from __future__ import annotations

import time
from typing import Any

from pipeline.lexical import build_shard_index
from workers.celery_app import app
from workers.names import Task
from workers.tasks.base import PipelineTask

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
