"""``shardfuse status``: everything an operator checks first, gathered in one place."""

from __future__ import annotations

from typing import Any

import psycopg
import redis
from prometheus_client import Counter

from shardfuse.pipeline.admin.dead_letters import dead_letter_count, recent_dead_letters
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import SchemaMissingError, ShardfuseError, StoreUnavailableError
from shardfuse.pipeline.index.store import ShardPools
from shardfuse.pipeline.index.store.inspection import chunk_quality
from shardfuse.pipeline.observability import metrics
from shardfuse.pipeline.observability.endpoint_directory import EndpointDirectory, scrape
from shardfuse.pipeline.observability.metric_totals import MetricTotals, add_up, parse_scrape
from shardfuse.workers import monitor
from shardfuse.workers.broker.inbox import UNREADABLE_KEY, recent_unreadable, unreadable_count
from shardfuse.workers.broker.redelivery import orphan_grace_s, orphaned_tags
from shardfuse.workers.stack import StackState, api_process

# How many of the newest set-aside items' reasons status shows.
UNREADABLE_SHOWN = 3


def collect_status(settings: Settings, *, state: StackState | None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "broker_url": settings.broker.display_url,  # password masked
        "flower_url": state.flower_url if state else None,
        "api_url": api_process.recorded_url(settings, state),
        "data_dir": str(settings.data_path),
        "shards": settings.shards,
        "processes": _processes(state),
    }
    try:
        client = monitor.broker_client(settings)
        status["queues"] = {
            "waiting": monitor.queue_depths(client),
            "in_flight": monitor.unacked_by_queue(client),
            "oldest_waiting_s": monitor.oldest_waiting_s(client),
            "oldest_in_flight_s": monitor.oldest_in_flight_s(client),
        }
        # Delivered to a worker that stopped beating: the next heartbeat of a live worker puts them back.
        status["held_by_dead_workers"] = len(orphaned_tags(client,
                                                           grace_s=orphan_grace_s(settings.delivery.dead_after_s)))
        # Items no worker could run, set aside by the transport with their reasons (shardfuse.workers.broker.inbox).
        status["unreadable_messages"] = unreadable_count(client)
        status["unreadable"] = recent_unreadable(client, limit=UNREADABLE_SHOWN)
        status["bm25"] = monitor.bm25_lag(settings, client)
        status.update(pool_metrics(settings, client))
    except (redis.RedisError, ShardfuseError) as exc:  # the monitor's views translate theirs; llen does not
        status["broker_error"] = str(exc)
    try:
        status.update(_database_status(settings))
    except (psycopg.Error, ShardfuseError) as exc:
        status["database_error"] = str(exc)
    return status


def _processes(state: StackState | None) -> dict[str, Any]:
    if state is None:
        return {}
    alive = state.alive()
    return {name: {"pid": comp.pid, "alive": name in alive, "log": str(comp.log)}
            for name, comp in state.components.items()}


def _database_status(settings: Settings) -> dict[str, Any]:
    with ShardPools(settings, min_size=1, max_size=2) as pools:
        shards = []
        skipped: list[dict[str, Any]] = []
        deferred: list[int] = []
        for store in pools.stores():
            try:
                zones = store.zone_counts()
                quality = chunk_quality(store)
                zones = [{**zone, **quality.get(zone["zone"], {})} for zone in zones]
                skipped.extend({"shard": store.shard, **row} for row in store.skipped_documents(limit=10))
                if store.vector_index_deferred():
                    deferred.append(store.shard)
            except SchemaMissingError:
                zones = []  # no worker has created this shard's tables yet
            shards.append({"shard": store.shard, "zones": zones})
        try:
            dead = dead_letter_count(pools.shared)
            failed = recent_dead_letters(pools.shared, limit=10)
        except SchemaMissingError:
            dead, failed = 0, []
        return {"shard_counts": shards, "skipped": skipped, "dead_letters": dead, "failed": failed,
                "vector_index_deferred": deferred}


def pool_metrics(settings: Settings, client: redis.Redis) -> dict[str, Any]:
    """What the worker pools counted: every pool's ``/metrics`` (announced in Redis,
    :mod:`shardfuse.pipeline.observability.endpoint_directory`) scraped and added up, and which endpoints
    were read. A pool that cannot be read is listed with the reason and left out of the sums."""
    endpoints = EndpointDirectory(client, stale_after_s=settings.delivery.dead_after_s).endpoints()
    scrapes, read = [], []
    for endpoint in endpoints:
        row: dict[str, Any] = {"node": endpoint.node, "url": endpoint.url}
        try:
            scrapes.append(parse_scrape(scrape(endpoint.url)))
        except (StoreUnavailableError, ValueError) as exc:  # ValueError: not Prometheus's text format
            row["error"] = str(exc)
        read.append(row)
    return {"metrics": metrics_summary(add_up(scrapes)), "metrics_endpoints": read}


def metrics_summary(totals: MetricTotals) -> dict[str, Any]:
    """The counters an operator reads first, summed over the pools' processes since each pool started."""
    def total(counter: Counter, **labels: object) -> int:
        return round(totals.counter(counter, **labels))

    by_stage = {stage: {outcome: round(n) for outcome, n in sorted(totals.breakdown(metrics.EVENTS, "outcome",
                                                                                    stage=stage).items())}
                for stage in sorted(totals.breakdown(metrics.EVENTS, "stage"))}
    hits, misses = total(metrics.EMBEDDING_CACHE_HITS), total(metrics.EMBEDDING_CACHE_MISSES)
    queries = totals.histogram(metrics.QUERY_DURATION)
    return {
        "events_indexed": total(metrics.EVENTS, stage="embed", outcome="indexed"),
        "events_deleted": total(metrics.EVENTS, stage="ingest", outcome="deleted"),
        "events_skipped": total(metrics.EVENTS, stage="ingest", outcome="skipped"),
        "events_failed": sum(total(metrics.EVENTS, stage=stage, outcome="dead_lettered")
                             for stage in ("ingest", "embed")),
        "events_by_stage": by_stage,
        "chunks_embedded": total(metrics.EMBEDDING_CHUNKS),
        "texts_embedded": total(metrics.EMBEDDING_TEXTS),
        "embedding_cache": {"hits": hits, "misses": misses,
                            "hit_ratio": hits / (hits + misses) if hits + misses else None},
        "provider_rate_limited": total(metrics.PROVIDER_RATE_LIMITED),
        "provider_retries": total(metrics.PROVIDER_RETRIES),
        "queries": {"count": round(queries.count), "p50_s": queries.quantile(0.5), "p99_s": queries.quantile(0.99),
                    "by_outcome": {k: round(v) for k, v in
                                   sorted(totals.histogram_counts(metrics.QUERY_DURATION, "outcome").items())}},
    }


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f" (oldest {seconds:.0f}s)" if seconds < 120 else f" (oldest {seconds / 60:.0f} min)"


def format_status(status: dict[str, Any]) -> str:
    """The status as lines for a person, in the order an operator checks them."""
    lines = [
        f"broker   {status['broker_url']}",
        f"flower   {status['flower_url'] or '(not started by shardfuse up)'}",
        f"api      {status.get('api_url') or '(not started by shardfuse up)'}",
        f"data     {status['data_dir']}",
    ]
    if status.get("broker_error"):
        lines.append(f"broker unreachable: {status['broker_error']}")
    lines.extend(_broker_lines(status))
    lines.extend(_metric_lines(status.get("metrics"), status.get("metrics_endpoints")))
    if status.get("database_error"):
        lines.append(f"database unreachable: {status['database_error']}")
    lines.extend(_shard_lines(status.get("shard_counts", [])))
    lines.extend(_attention_lines(status))
    return "\n".join(lines)


def _broker_lines(status: dict[str, Any]) -> list[str]:
    """Queues, stuck and unreadable messages, BM25 freshness."""
    lines = []
    if "queues" in status:
        queues = status["queues"]
        for q, n in queues["waiting"].items():
            lines.append(f"queue    {q:<12} {n} waiting{_age(queues['oldest_waiting_s'][q])}, "
                         f"{queues['in_flight'][q]} in flight{_age(queues['oldest_in_flight_s'][q])}")
    if status.get("held_by_dead_workers"):
        lines.append(f"stuck    {status['held_by_dead_workers']} message(s) held by workers that stopped: a live "
                     "worker puts them back on their queues at its next heartbeat")
    if status.get("unreadable_messages"):
        lines.append(f"unread   {status['unreadable_messages']} message(s) no worker could run, set aside in Redis "
                     f"list {UNREADABLE_KEY} (shardfuse unreadable shows them); the newest:")
        lines.extend(f"unread   [{row['queue']}] {row['size']} bytes: {row['reason'][:160]}"
                     for row in status.get("unreadable", []))
    for row in status.get("bm25", []):
        fresh = "current" if row["current"] else "rebuild pending"
        behind = (f", {row['lag_versions']} document(s) behind for {row['behind_s']:.1f}s"
                  if row.get("lag_versions") else "")
        lines.append(f"bm25     shard {row['shard']}: generation {row['generation']}, "
                     f"{row['documents']} chunks, {fresh}{behind}")
    return lines


def _shard_lines(shard_counts: list[dict[str, Any]]) -> list[str]:
    lines = []
    for shard in shard_counts:
        if not shard["zones"]:
            lines.append(f"shard {shard['shard']}  (empty)")
        for zone in shard["zones"]:
            lines.append(f"shard {shard['shard']}  zone {zone['zone']}: {zone['documents']} documents, "
                         f"{zone['chunks']} chunks, {zone['skipped']} skipped, {zone['deleted']} deleted")
            dropped = dict(zone.get("dropped") or {})
            if truncated := dropped.pop("embedding_truncated", 0):  # pipeline/embed/batcher.py TRUNCATED
                lines.append(f"           chunks the embedding model read only the start of: {truncated} "
                             "(embedder.oversize_input = split embeds all of them)")
            if dropped:
                lines.append("           chunks dropped by the entropy filter: " + ", ".join(
                    f"{count} {reason}" for reason, count in sorted(dropped.items())))
            if zone.get("backfill_documents"):
                lines.append(f"           waiting for LLM contexts: {zone['backfill_chunks']} chunk(s) of "
                             f"{zone['backfill_documents']} document(s) (shardfuse backfill-context)")
    return lines


def _attention_lines(status: dict[str, Any]) -> list[str]:
    """Deferred indexes, dead letters, skipped documents, the stack's processes."""
    lines = [f"vector   shard {shard}: HNSW index deferred for a bulk load (exact scans until it is built)"
             for shard in status.get("vector_index_deferred", [])]
    if "dead_letters" in status:
        lines.append(f"dead letters: {status['dead_letters']}")
    for row in status.get("failed", []):
        where = f"[{row['zone']}] {row['path']}" if row["path"] else row["task"]
        lines.append(f"failed   #{row['id']} {where}: {row['reason']} ({row['attempts']} attempt(s))")
    lines.extend(f"skipped  [{row['zone']}] {row['path']}: {row['reason']}" for row in status.get("skipped", []))
    lines.extend(f"process  {name:<20} pid {proc['pid']:<8} {'running' if proc['alive'] else 'DEAD'}"
                 for name, proc in status.get("processes", {}).items())
    return lines


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _metric_lines(summary: dict[str, Any] | None, endpoints: list[dict[str, Any]] | None) -> list[str]:
    if not summary:
        return []
    read = [row for row in endpoints or [] if "error" not in row]
    lines = [f"metrics  {len(read)} pool endpoint(s) read" if endpoints else
             "metrics  no worker pool serves /metrics (workers.metrics_port)"]
    lines.extend(f"metrics  {row['node']} at {row['url']}: {row['error']}" for row in endpoints or []
                 if "error" in row)
    cache = summary["embedding_cache"]
    rate = "-" if cache["hit_ratio"] is None else f"{cache['hit_ratio']:.0%}"
    queries = summary["queries"]
    return [
        *lines,
        f"events   {summary['events_indexed']} indexed, "
        f"{summary['events_deleted']} deleted, {summary['events_skipped']} skipped, "
        f"{summary['events_failed']} failed (dead-lettered)",
        f"embed    {summary['chunks_embedded']} chunks, {summary['texts_embedded']} embedded, cache hit rate {rate} "
        f"({cache['hits']} of {cache['hits'] + cache['misses']} texts); provider: "
        f"{summary['provider_rate_limited']} rate-limited (429), {summary['provider_retries']} retries",
        f"queries  {queries['count']}, p50 {_ms(queries['p50_s'])}, p99 {_ms(queries['p99_s'])}",
    ]
