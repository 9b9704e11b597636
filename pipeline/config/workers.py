"""How the workers run: pool sizes and task time limits, delivery (leases, liveness), the embedded stack
and Flower (sections of :class:`shardfuse.pipeline.config.settings.Settings`)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from shardfuse.pipeline.config.section import Section as _Section


class TaskLimits(_Section):
    soft_s: int
    hard_s: int


class WorkerSettings(_Section):
    ingest_concurrency: int = 2
    embed_concurrency: int = 8
    # 2: a BM25 delta (what makes a commit searchable by keyword) never waits behind a merge or the index builds
    # after a bulk load, which each hold a process for seconds to minutes.
    maintenance_concurrency: int = 2
    query_concurrency: int = 4
    max_retries: int = 5
    ingest_limits: TaskLimits = TaskLimits(soft_s=120, hard_s=150)
    embed_limits: TaskLimits = TaskLimits(soft_s=300, hard_s=360)
    maintenance_limits: TaskLimits = TaskLimits(soft_s=900, hard_s=960)
    query_limits: TaskLimits = TaskLimits(soft_s=30, hard_s=35)
    # Whether the query pool sends Celery task events (received, started, succeeded) for each search, which is
    # what lists searches in Flower. Off by default: the worker's main loop publishes those events while the
    # search runs, and they took the GIL from it: with them on, the RPC p50 was 1.76 ms higher and the worker's
    # keyword stage 1.35 ms slower (medians of ten interleaved pairs on one stack, higher in all ten;
    # docs/performance.md, session 22). And at many searches a second they would push the pipeline's
    # tasks out of Flower's task list. The pool still shows in Flower (worker events); the query metrics count
    # every search.
    search_events: bool = False
    # The pool's Prometheus endpoint: its main process serves /metrics of every process of the pool on this
    # port, all interfaces (shardfuse.workers.observability); 0: none. A prefork pool also needs the
    # PROMETHEUS_MULTIPROC_DIR variable (docs/operations.md).
    metrics_port: int = Field(default=0, ge=0, le=65535)

    @property
    def longest_hard_s(self) -> int:
        """The longest hard time limit of any task."""
        return max(limit.hard_s for limit in (self.ingest_limits, self.embed_limits, self.maintenance_limits,
                                              self.query_limits))


class DeliverySettings(_Section):
    """Document leases and dead-worker release (:mod:`shardfuse.pipeline.coordination.leases`,
    :mod:`shardfuse.pipeline.coordination.liveness`, :mod:`shardfuse.workers.broker.redelivery`)."""

    heartbeat_s: float = Field(default=3.0, gt=0)  # each worker process says it is alive this often
    # Silent this long: dead. Its document leases may be taken over and the messages it held are put back
    # on their queues (without waiting for broker.visibility_timeout_s).
    dead_after_s: float = Field(default=20.0, gt=0)
    # Bounds a lease whose holder keeps beating but never gives it back; must outlast the task hard limits.
    lease_s: float = Field(default=900.0, gt=0)
    busy_retry_s: float = Field(default=2.0, gt=0)  # a document another live worker holds: try again after


class StackSettings(_Section):
    """The embedded single-machine stack started by ``shardfuse up``.

    Redis and PostgreSQL listen where ``broker.url`` and ``postgres.dsn`` point (loopback only), so each
    address is configured exactly once.
    """

    flower_port: int = 15555
    # The HTTP API (`shardfuse api`, shardfuse.workers.http) that `up` starts beside Flower; 0: none.
    api_port: int = Field(default=15560, ge=0, le=65535)
    # The worker pools' /metrics, on loopback: the ingest pool's port, then embed, maintenance and query on the
    # next ones (shardfuse.workers.stack.celery_processes.worker_metrics); 0: none.
    metrics_port: int = Field(default=15556, ge=0, le=65532)
    # The embedded Redis refuses writes past this much memory (maxmemory, noeviction: a publisher gets an error
    # and keeps its events) instead of growing until the OOM killer takes it with acknowledged writes; 0: no
    # limit. docs/operations.md, "Memory budget", says what fills it.
    redis_maxmemory_mb: int = Field(default=1024, ge=0)


class FlowerSettings(_Section):
    user: str = "shardfuse"
    password: SecretStr = SecretStr("shardfuse")
