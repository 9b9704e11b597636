"""The Prometheus collector of ``shardfuse exporter``: the deployment's state, read afresh at every scrape
from the broker's Redis, the BM25 manifests and PostgreSQL (queue depths and ages, messages held by dead
workers, the pools alive per queue, BM25 lag, deferred vector indexes, dead letters).

It serves gauges only, of state every process shares: one exporter serves a whole deployment. What the
processes count (events, embeddings, provider calls, query durations) each worker pool serves itself at
its own ``/metrics`` (:mod:`shardfuse.workers.observability`), where Prometheus scrapes it and adds the
pools up; the exporter never repeats those counts, so no sum can count them twice.

Names are ``shardfuse_*``. A part that cannot be read (Redis or PostgreSQL down) is left out of the
scrape and ``shardfuse_up{component}`` says 0: a scrape never fails with a 500 because what it watches is
down.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import redis
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shardfuse.pipeline.admin.dead_letters import dead_letter_count
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.build_schedule import VectorIndexSchedule
from shardfuse.pipeline.core.errors import SchemaMissingError, ShardfuseError
from shardfuse.pipeline.index.store import vector_index
from shardfuse.pipeline.index.store.schema import shard_schema
from shardfuse.pipeline.observability.endpoint_directory import EndpointDirectory
from shardfuse.workers import monitor
from shardfuse.workers.broker.inbox import unreadable_count
from shardfuse.workers.broker.redelivery import orphan_grace_s, orphaned_tags
from shardfuse.workers.names import Queue

log = logging.getLogger(__name__)
NAMESPACE = "shardfuse"
# A scrape waits this long at most for PostgreSQL to accept a connection.
CONNECT_TIMEOUT_S = 3


def _gauge(name: str, documentation: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{NAMESPACE}_{name}", documentation, labels=labels or [])


def broker_families(settings: Settings, client: redis.Redis) -> list[Metric]:
    """Queues, stuck messages and index lag, read from the broker's Redis and the BM25 manifests."""
    waiting = _gauge("queue_waiting_messages", "Messages waiting in the queue.", ["queue"])
    in_flight = _gauge("queue_in_flight_messages", "Messages delivered to a worker and not yet acknowledged.",
                       ["queue"])
    oldest_waiting = _gauge("queue_oldest_waiting_seconds",
                            "How long the message next in line has waited (0: none waiting).", ["queue"])
    oldest_held = _gauge("queue_oldest_in_flight_seconds",
                         "How long the longest-held delivered message has been held (0: none).", ["queue"])
    depths, unacked = monitor.queue_depths(client), monitor.unacked_by_queue(client)
    ages, held = monitor.oldest_waiting_s(client), monitor.oldest_in_flight_s(client)
    for queue in sorted(depths):
        waiting.add_metric([queue], depths[queue])
        in_flight.add_metric([queue], unacked[queue])
        oldest_waiting.add_metric([queue], ages[queue] or 0.0)
        oldest_held.add_metric([queue], held[queue] or 0.0)
    dead_held = _gauge("messages_held_by_dead_workers", "Delivered messages held by workers that stopped.")
    dead_held.add_metric([], len(orphaned_tags(client, grace_s=orphan_grace_s(settings.delivery.dead_after_s))))
    unreadable = _gauge("unreadable_messages", "Items on the queues no worker could run, set aside with their "
                                               "reasons (shardfuse unreadable).")
    unreadable.add_metric([], unreadable_count(client))

    lag = _gauge("bm25_lag_versions",
                 "Documents of the shard written since its published BM25 index was read (not yet keyword-searchable).",
                 ["shard"])
    behind = _gauge("bm25_behind_seconds", "Since the first commit the shard's BM25 index lacks (0: none).",
                    ["shard"])
    current = _gauge("bm25_current", "1 when the shard's BM25 index includes every commit and was built by "
                                     "the configured tokenizer.", ["shard"])
    generation = _gauge("bm25_generation", "The shard's published BM25 generation (-1: none yet).", ["shard"])
    scheduled = _gauge("vector_index_build_scheduled",
                       "1 while a deferred HNSW index build of the shard is scheduled.", ["shard"])
    for row in monitor.bm25_lag(settings, client):
        shard = [str(row["shard"])]
        lag.add_metric(shard, row["lag_versions"])
        behind.add_metric(shard, row["behind_s"])
        current.add_metric(shard, int(row["current"]))
        generation.add_metric(shard, -1 if row["generation"] is None else row["generation"])
        scheduled.add_metric(shard, int(VectorIndexSchedule(client).scheduled(row["shard"])))
    return [waiting, in_flight, oldest_waiting, oldest_held, dead_held, unreadable, lag, behind, current, generation,
            scheduled, pool_family(settings, client)]


def pool_family(settings: Settings, client: redis.Redis) -> Metric:
    """Per queue, the worker pools whose heartbeat is current: each pool announces its ``/metrics`` endpoint
    every ``delivery.heartbeat_s`` (:mod:`shardfuse.pipeline.observability.endpoint_directory`), and one silent
    for ``delivery.dead_after_s`` (stopped, killed, cut off) no longer counts. A pool that serves no metrics
    (``workers.metrics_port`` 0) does not announce itself either."""
    alive = _gauge("pools_alive", "Worker pools of the queue whose heartbeat (metrics endpoint announcement) is "
                                  "current; 0: no pool consumes the queue.", ["queue"])
    directory = EndpointDirectory(client, stale_after_s=settings.delivery.dead_after_s)
    pools = Counter(endpoint.node.partition("@")[0] for endpoint in directory.endpoints())
    for queue in Queue:
        alive.add_metric([queue.value], pools.get(queue.value, 0))
    return alive


class _OneConnection:
    """A connection lent as a pool (what :func:`shardfuse.pipeline.admin.dead_letters.dead_letter_count` takes)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def connection(self) -> contextlib.nullcontext[psycopg.Connection[Any]]:
        return contextlib.nullcontext(self._conn)


def database_families(settings: Settings) -> list[Metric]:
    """Dead letters and deferred HNSW indexes, from PostgreSQL (one short-lived connection per database)."""
    deferred = _gauge("vector_index_deferred", "1 while the shard's HNSW index is dropped for a bulk load "
                                               "(searches are exact scans until it is built).", ["shard"])
    dead = _gauge("dead_letters", "Dead letters waiting for a person (shardfuse deadletters).")
    connections: dict[str, psycopg.Connection[Any]] = {}

    def connect(dsn: str) -> psycopg.Connection[Any]:
        if dsn not in connections:
            connections[dsn] = psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        return connections[dsn]

    try:
        try:
            shared: Any = _OneConnection(connect(settings.postgres.dsn))
            dead.add_metric([], dead_letter_count(shared))
        except SchemaMissingError:
            dead.add_metric([], 0)  # no worker has created the shared tables yet
        for shard in range(settings.shards):
            try:
                is_deferred = vector_index.is_deferred(connect(settings.shard_dsn(shard)), shard_schema(shard))
            except psycopg.errors.UndefinedTable:
                is_deferred = False
            deferred.add_metric([str(shard)], int(is_deferred))
    finally:
        for conn in connections.values():
            conn.close()
    return [dead, deferred]


class ShardfuseCollector(Collector):
    """Everything ``/metrics`` shows, read afresh at each scrape."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client = monitor.broker_client(settings)

    def collect(self) -> Iterator[Metric]:
        up = _gauge("up", "1 when the exporter could read the component at this scrape.", ["component"])
        families: list[Metric] = []
        try:
            families += broker_families(self._settings, self._client)
            up.add_metric(["redis"], 1)
        except (redis.RedisError, OSError, ShardfuseError) as exc:
            log.warning("scrape: cannot read Redis at %s: %s", self._settings.broker.display_url, exc)
            up.add_metric(["redis"], 0)
        try:
            families += database_families(self._settings)
            up.add_metric(["postgres"], 1)
        except (psycopg.Error, OSError, ShardfuseError) as exc:
            log.warning("scrape: cannot read PostgreSQL: %s", exc)
            up.add_metric(["postgres"], 0)
        yield from families
        yield up
