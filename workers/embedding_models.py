"""A worker process's embedding models: the default one ([embedder]) and those of [embedders.<name>] that a
reindexed zone uses, each built on first use: its embedder, its embedding stage (cache, backpressure,
retries) for the embed pool, and its cached query embedder for the query pool.

The query pool asks :meth:`EmbeddingModels.active` which model a zone's queries use
(``pipeline/index/store/zone_models.py``); ``query/search.py`` takes this object as its ``QueryModels``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from shardfuse.pipeline.config.settings import EmbedderProvider, EmbedderSettings, Settings
from shardfuse.pipeline.embed.limiters.backpressure import build_backpressure
from shardfuse.pipeline.embed.providers import Embedder, build_embedder, request_batch_size
from shardfuse.pipeline.embed.query_cache import CachedQueryEmbedder
from shardfuse.pipeline.embed.stage import EmbeddingStage
from shardfuse.pipeline.index.store.embedding_cache import EmbeddingCache
from shardfuse.pipeline.index.store.zone_models import ActiveModels

T = TypeVar("T")


def build_stage(settings: EmbedderSettings, embedder: Embedder, *, shared_pool: Any,
                redis_client: redis.Redis) -> EmbeddingStage:
    """The embedding stage of one model: its cache first (``embedder.cache``), then packed requests (remote
    providers under backpressure shared by every worker)."""
    remote = settings.provider in (EmbedderProvider.OPENAI, EmbedderProvider.VOYAGE)
    return EmbeddingStage(
        embedder=embedder,
        batch_size=request_batch_size(settings, embedder),
        cache=EmbeddingCache(shared_pool, provider=settings.provider.value, model=embedder.name,
                             dimensions=embedder.dimensions) if settings.uses_cache else None,
        # Remote providers share quotas across every worker; a local model only competes for CPU.
        backpressure=build_backpressure(settings, redis_client) if remote else None,
        oversize_rule=settings.oversize_input,
        max_concurrent=settings.max_concurrent if remote else 1,
        max_retry_s=settings.max_retry_s,
        request_timeout_s=settings.request_timeout_s,
    )


class EmbeddingModels:
    """Per model name: embedder, stage and query embedder, built once per process under a lock."""

    def __init__(self, settings: Settings, *, shared_pool: Callable[[], Any], redis_client: Callable[[], redis.Redis],
                 default_embedder: Callable[[], Embedder]) -> None:
        self._settings = settings
        self._shared_pool = shared_pool
        self._redis = redis_client
        self._default_embedder = default_embedder
        self._lock = threading.RLock()
        self._built: dict[tuple[str, str], Any] = {}
        self._active: ActiveModels | None = None

    def _once(self, kind: str, model: str, build: Callable[[], T]) -> T:
        with self._lock:
            if (kind, model) not in self._built:
                self._built[(kind, model)] = build()
            return self._built[(kind, model)]  # type: ignore[no-any-return]

    def embedder(self, model: str) -> Embedder:
        settings = self._settings.embedder_for(model)  # ConfigurationError for a model this process lacks
        if settings is self._settings.embedder:
            return self._default_embedder()
        return self._once("embedder", model, lambda: build_embedder(settings, models_dir=self._settings.models_dir))

    def stage(self, model: str) -> EmbeddingStage:
        settings = self._settings.embedder_for(model)
        return self._once("stage", model, lambda: build_stage(settings, self.embedder(model),
                                                              shared_pool=self._shared_pool(),
                                                              redis_client=self._redis()))

    def embedders(self, model: str) -> tuple[Embedder, Embedder]:
        """``model``'s query embedder, and the same behind the per-process LRU and Redis."""
        settings = self._settings.embedder_for(model)
        embedder = self.embedder(model)
        cached = self._once("query", model, lambda: CachedQueryEmbedder.from_settings(embedder, settings,
                                                                                      redis=self._redis()))
        return embedder, cached

    def active(self, zone: str) -> str:
        """The model ``zone``'s queries use (the shared ``zone_models`` table, read at most once a second)."""
        with self._lock:
            if self._active is None:
                self._active = ActiveModels(self._shared_pool())
        return self._active.model(zone)

    def close(self) -> None:
        with self._lock:
            for (kind, _), built in self._built.items():
                if kind == "stage":
                    built.close()
            self._built.clear()
