"""Per-process resources of a worker: database pools, stores, the embedder, the batcher, the searcher.

Built lazily on first use and eagerly in the worker's start-up signals (never at import; see
:mod:`shardfuse.workers.lifecycle`), once per process: a prefork child builds its own after the fork,
because pooled sockets must not cross a fork.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import redis

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.chunk_registry import RedisChunkRegistry
from shardfuse.pipeline.coordination.leases import DocumentLeases
from shardfuse.pipeline.coordination.liveness import Heartbeat, new_holder_id
from shardfuse.pipeline.core.errors import TransientError
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.embed.batcher import EmbedBatcher
from shardfuse.pipeline.embed.providers import Embedder, build_embedder, request_batch_size
from shardfuse.pipeline.index.lexical import Tokenizer
from shardfuse.pipeline.index.lexical.follower import IndexFollower
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.maintenance import manifest_readers, shard_mirror
from shardfuse.pipeline.index.store import ShardPools, ShardStore
from shardfuse.pipeline.index.store.bulk_load import BulkLoadGate
from shardfuse.pipeline.index.store.connections import pooled_connection
from shardfuse.pipeline.index.store.context_cache import PostgresContextCache
from shardfuse.pipeline.index.store.schema import ensure_shared_schema
from shardfuse.pipeline.index.store.vector_index import DeferPolicy
from shardfuse.pipeline.ingest.context.factory import build_contextualizer
from shardfuse.pipeline.ingest.context.llm import LlmContextualizer
from shardfuse.pipeline.storage.cas import ContentStore
from shardfuse.pipeline.storage.opening import open_content_store
from shardfuse.query.search import SearchService
from shardfuse.workers.embedding_models import EmbeddingModels, build_stage
from shardfuse.workers.names import Queue
from shardfuse.workers.searching import build_searcher

log = logging.getLogger(__name__)
T = TypeVar("T")
# Warm-up tries again after this long, doubling up to the maximum, while a store it needs is out of reach.
WARM_UP_RETRY_S = 1.0
WARM_UP_RETRY_MAX_S = 15.0
# What each queue's tasks need (WorkerRuntime's properties), built by warm_up.
_WARM_UP_NEEDS: dict[str, tuple[str, ...]] = {
    Queue.INGEST: ("stores", "shared_pool", "cas", "counter", "freshness", "leases"),
    Queue.EMBED: ("stores", "shared_pool", "embedder", "batcher", "freshness", "leases"),
    Queue.MAINTENANCE: ("stores", "shared_pool", "freshness"),
    Queue.QUERY: ("searcher",),
}


class WorkerRuntime:
    """Everything one worker process needs, each piece created on first use under a lock."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.RLock()
        self._closed = threading.Event()
        pg = settings.postgres
        self._pools = ShardPools(settings, min_size=pg.pool_min_size, max_size=pg.pool_max_size)

    def _once(self, name: str, build: Callable[[], T]) -> T:
        with self._lock:
            if name not in self.__dict__:
                self.__dict__[name] = build()
            return self.__dict__[name]  # type: ignore[no-any-return]

    @property
    def stores(self) -> list[ShardStore]:
        return self._once("_stores", self._build_stores)

    def _build_stores(self) -> list[ShardStore]:
        stores = self._pools.stores()
        for store in stores:
            store.ensure_schema()
        return stores

    @property
    def shared_pool(self) -> Any:
        """The pool of the database holding shared tables (dead letters), which it creates if missing."""

        def build() -> Any:
            pool = self._pools.shared
            with pooled_connection(pool, what="the shared tables") as conn:
                ensure_shared_schema(conn)
            return pool

        return self._once("_shared_pool", build)

    @property
    def cas(self) -> ContentStore:
        return self._once("_cas", lambda: open_content_store(self.settings))

    @property
    def counter(self) -> TokenCounter:
        return self._once("_counter", lambda: TokenCounter(self.settings.chunking.encoding,
                                                             bpe_dir=self.settings.chunking.bpe_dir))

    @property
    def embedder(self) -> Embedder:
        settings = self.settings
        return self._once("_embedder", lambda: build_embedder(settings.embedder, models_dir=settings.models_dir))

    @property
    def lexical_tokenizer(self) -> Tokenizer:
        """The BM25 tokenizer; the same one builds the indexes and tokenizes queries."""
        return self._once("_tokenizer", lambda: Tokenizer(stem=self.settings.bm25.stemming))

    @property
    def redis(self) -> redis.Redis:
        return self._once("_redis", lambda: redis.Redis.from_url(self.settings.broker.url))

    @property
    def heartbeat(self) -> Heartbeat:
        """This process's liveness (its document leases are released when it stops beating)."""
        delivery = self.settings.delivery
        return self._once("_heartbeat", lambda: Heartbeat(
            self.redis, holder=new_holder_id("worker"), interval_s=delivery.heartbeat_s,
            dead_after_s=delivery.dead_after_s).start())

    @property
    def leases(self) -> DocumentLeases:
        return self._once("_leases", lambda: DocumentLeases(self.redis, holder=self.heartbeat.holder,
                                                            ttl_s=self.settings.delivery.lease_s))

    @property
    def freshness(self) -> Bm25Freshness:
        return self._once("_freshness", lambda: Bm25Freshness(self.redis))

    @property
    def contextualizer(self) -> LlmContextualizer | None:
        """The LLM context source when ``context.source`` is ``llm``, else None."""
        settings = self.settings
        if settings.context.source != "llm":
            return None
        return self._once("_contextualizer", lambda: build_contextualizer(
            settings.context, counter=self.counter, cache=PostgresContextCache(self.shared_pool), redis=self.redis))

    @property
    def chunk_registry(self) -> RedisChunkRegistry | None:
        """The entropy filter's memory across documents, when the filter is on."""
        if not self.settings.entropy.enabled:
            return None
        return self._once("_chunk_registry", lambda: RedisChunkRegistry(
            self.redis, max_chunks=self.settings.entropy.registry_max_chunks))

    def pending_documents(self) -> int:
        """Documents waiting in the ingest and embed queues (queued messages × events per message)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(Queue.INGEST.value)
        pipe.llen(Queue.EMBED.value)
        return sum(int(n) for n in pipe.execute()) * self.settings.broker.events_per_message

    @property
    def bulk_load_gate(self) -> BulkLoadGate:
        policy = DeferPolicy(min_rows=self.settings.vector_index.defer_min_rows)
        return self._once("_bulk_load_gate",
                          lambda: BulkLoadGate(self.stores, policy=policy, backlog=self.pending_documents))

    @property
    def models(self) -> EmbeddingModels:
        """The embedding models of zones reindexed away from the default one (built on first use)."""
        return self._once("_models", lambda: EmbeddingModels(
            self.settings, shared_pool=lambda: self.shared_pool, redis_client=lambda: self.redis,
            default_embedder=lambda: self.embedder))

    @property
    def batcher(self) -> EmbedBatcher:
        emb = self.settings.embedder

        def build() -> EmbedBatcher:
            stage = build_stage(emb, self.embedder, shared_pool=self.shared_pool, redis_client=self.redis)
            return EmbedBatcher(stage=stage, stores=self.stores, max_chunks=request_batch_size(emb, self.embedder) * 4,
                                max_wait_s=emb.batch_wait_ms / 1000, gate=self.bulk_load_gate,
                                stages=self.models.stage)

        return self._once("_batcher", build)

    @property
    def bm25_follower(self) -> IndexFollower:
        """This node's copy of every shard's published BM25 index, kept in step (started by :attr:`searcher`)."""
        return self._once("_bm25_follower", lambda: IndexFollower(
            [shard_mirror(self.settings, store) for store in self.stores],
            interval_s=self.settings.bm25.follow_interval_s, readers=manifest_readers(self.stores)))

    def readiness(self) -> dict[str, Any]:
        """Whether this process can answer its queues' tasks completely: for queries, whether every shard's
        BM25 index has been fetched (``shardfuse ping`` reports it)."""
        follower = self.__dict__.get("_bm25_follower")
        if follower is None:
            return {"ready": "_searcher" in self.__dict__, "bm25": "not fetched yet"}
        return {**follower.status(), "ready": follower.ready and "_searcher" in self.__dict__}

    @property
    def searcher(self) -> SearchService:
        return self._once("_searcher", lambda: build_searcher(self))

    def warm_up(self, queues: Iterable[str]) -> list[str]:
        """Create what the given queues' tasks need, so the first task does not pay for it. Each piece is
        tried even when another fails (PostgreSQL not up yet must not leave the embedder unloaded); returns
        the pieces that failed with a :class:`TransientError` (a store out of reach), to be tried again."""
        queues = list(queues)
        pending: list[str] = []
        for name in dict.fromkeys(name for queue in queues for name in _WARM_UP_NEEDS.get(queue, ())):
            try:
                getattr(self, name)
            except TransientError as exc:
                pending.append(name)
                log.warning("worker runtime: %s not ready yet (%s)", name, exc)
        if not pending:
            log.info("worker runtime ready for queues %s (pid %d)", ",".join(queues), os.getpid())
        return pending

    def start_warm_up(self, queues: Iterable[str]) -> threading.Thread | None:
        """:meth:`warm_up` now; if a store was out of reach, again in a background thread after each failure
        (backing off to :data:`WARM_UP_RETRY_MAX_S`) until everything is built or the runtime is closed. A
        worker started before its database answers so starts consuming (and watching deliveries) at once, and
        is warm as soon as the database is up; a task that comes first builds what it needs itself."""
        queues = list(queues)
        if not self.warm_up(queues):
            return None

        def run() -> None:
            delay = WARM_UP_RETRY_S
            try:
                while not self._closed.wait(delay) and self.warm_up(queues):
                    delay = min(delay * 2, WARM_UP_RETRY_MAX_S)
            except Exception:  # a permanent failure (settings): the first task that needs it reports it again
                log.exception("worker runtime: warm-up failed for queues %s", ",".join(queues))

        thread = threading.Thread(target=run, name="shardfuse-warm-up", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            follower = self.__dict__.pop("_bm25_follower", None)
            if follower is not None:
                follower.stop()
            for name in ("_batcher", "_searcher", "_models", "_contextualizer", "_heartbeat"):
                if name in self.__dict__:
                    self.__dict__.pop(name).close()
            self._pools.close()
            self.__dict__.pop("_leases", None)
            self.__dict__.pop("_stores", None)
            self.__dict__.pop("_shared_pool", None)


class RuntimeHolder:
    """Hands each process its own :class:`WorkerRuntime` (rebuilt after a fork)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._runtime: WorkerRuntime | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def get(self) -> WorkerRuntime:
        with self._lock:
            if self._runtime is None or self._pid != os.getpid():
                self._runtime = WorkerRuntime(self.settings)
                self._pid = os.getpid()
            return self._runtime

    def readiness(self) -> dict[str, Any]:
        """This process's runtime's :meth:`WorkerRuntime.readiness`; ``{"ready": None}`` when it runs no tasks
        itself (a prefork pool's parent: its children do)."""
        with self._lock:
            runtime = self._runtime if self._pid == os.getpid() else None
        return runtime.readiness() if runtime is not None else {"ready": None}

    def close(self) -> None:
        with self._lock:
            if self._runtime is not None and self._pid == os.getpid():
                self._runtime.close()
            self._runtime = None
