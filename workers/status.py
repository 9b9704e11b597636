"""``shardfuse status``: everything an operator checks first, gathered in one place."""

from __future__ import annotations

from typing import Any

import psycopg
import redis

from shardfuse.pipeline.admin.dead_letters import dead_letter_count, recent_dead_letters
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ShardfuseError
from shardfuse.pipeline.index.store import ShardPools
from shardfuse.pipeline.index.store.inspection import chunk_quality
from shardfuse.pipeline.observability import metrics
from shardfuse.pipeline.observability.metric_totals import MetricTotals, read_totals
from shardfuse.workers import monitor
from shardfuse.workers.broker.inbox import UNREADABLE_KEY
from shardfuse.workers.broker.redelivery import orphan_grace_s, orphaned_tags
from shardfuse.workers.stack import StackState


def collect_status(settings: Settings, *, state: StackState | None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "broker_url": settings.broker.display_url,  # password masked
        "flower_url": state.flower_url if state else None,
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
        # Messages that were no kombu envelope at all, kept aside by the transport (shardfuse.workers.broker.inbox).
        status["unreadable_messages"] = int(client.llen(UNREADABLE_KEY))
        status["bm25"] = monitor.bm25_lag(settings, client)
        # Totals every process flushed (shardfuse.pipeline.observability.metrics): what `shardfuse exporter` serves,
        # summed up.
        status["metrics"] = metrics_summary(read_totals(client))
    except redis.RedisError as exc:
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
            except psycopg.errors.UndefinedTable:
                zones = []  # no worker has created this shard's tables yet
            shards.append({"shard": store.shard, "zones": zones})
        try:
            dead = dead_letter_count(pools.shared)
            failed = recent_dead_letters(pools.shared, limit=10)
        except psycopg.errors.UndefinedTable:
            dead, failed = 0, []
        return {"shard_counts": shards, "skipped": skipped, "dead_letters": dead, "failed": failed,
                "vector_index_deferred": deferred}


def metrics_summary(totals: MetricTotals) -> dict[str, Any]:
    """The counters an operator reads first, summed over every process since counting began."""
    def total(name: str, **labels: object) -> int:
        return round(totals.counter(name, **labels))

    by_stage = {stage: {outcome: round(n) for outcome, n in sorted(totals.breakdown(metrics.EVENTS, "outcome",
                                                                                    stage=stage).items())}
                for stage in sorted(totals.breakdown(metrics.EVENTS, "stage"))}
    hits, misses = total(metrics.EMBEDDING_CACHE_HITS), total(metrics.EMBEDDING_CACHE_MISSES)
    queries = totals.histogram(metrics.QUERY_DURATION)
    return {
        "events_published": total(metrics.EVENTS_PUBLISHED),
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
        "queries": {"count": queries.count, "p50_s": queries.quantile(0.5), "p99_s": queries.quantile(0.99),
                    "by_outcome": {k: round(v) for k, v in sorted(_counts(totals, "outcome").items())}},
    }


def _counts(totals: MetricTotals, label: str) -> dict[str, int]:
    """Observations of the query histogram by the value of ``label``."""
    out: dict[str, int] = {}
    for (name, labels), hist in totals.histograms.items():
        if name == metrics.QUERY_DURATION:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0) + hist.count
    return out


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f" (oldest {seconds:.0f}s)" if seconds < 120 else f" (oldest {seconds / 60:.0f} min)"


def format_status(status: dict[str, Any]) -> str:
    lines = [
        f"broker   {status['broker_url']}",
        f"flower   {status['flower_url'] or '(not started by shardfuse up)'}",
        f"data     {status['data_dir']}",
    ]
    if status.get("broker_error"):
        lines.append(f"broker unreachable: {status['broker_error']}")
    if "queues" in status:
        queues = status["queues"]
        for q, n in queues["waiting"].items():
            lines.append(f"queue    {q:<12} {n} waiting{_age(queues['oldest_waiting_s'][q])}, "
                         f"{queues['in_flight'][q]} in flight{_age(queues['oldest_in_flight_s'][q])}")
    if status.get("held_by_dead_workers"):
        lines.append(f"stuck    {status['held_by_dead_workers']} message(s) held by workers that stopped: a live "
                     "worker puts them back on their queues at its next heartbeat")
    if status.get("unreadable_messages"):
        lines.append(f"unread   {status['unreadable_messages']} message(s) that were not task messages kept in Redis "
                     f"list {UNREADABLE_KEY} (the worker logs said why); inspect with LRANGE, then DEL it")
    for row in status.get("bm25", []):
        fresh = "current" if row["current"] else "rebuild pending"
        behind = (f", {row['lag_versions']} commit(s) behind for {row['behind_s']:.1f}s"
                  if row.get("lag_versions") else "")
        lines.append(f"bm25     shard {row['shard']}: generation {row['generation']}, "
                     f"{row['documents']} chunks, {fresh}{behind}")
    lines.extend(_metric_lines(status.get("metrics")))
    if status.get("database_error"):
        lines.append(f"database unreachable: {status['database_error']}")
    for shard in status.get("shard_counts", []):
        if not shard["zones"]:
            lines.append(f"shard {shard['shard']}  (empty)")
        for zone in shard["zones"]:
            lines.append(f"shard {shard['shard']}  zone {zone['zone']}: {zone['documents']} documents, "
                         f"{zone['chunks']} chunks, {zone['skipped']} skipped, {zone['deleted']} deleted")
            if zone.get("dropped"):
                lines.append("           chunks dropped by the entropy filter: " + ", ".join(
                    f"{count} {reason}" for reason, count in sorted(zone["dropped"].items())))
            if zone.get("backfill_documents"):
                lines.append(f"           waiting for LLM contexts: {zone['backfill_chunks']} chunk(s) of "
                             f"{zone['backfill_documents']} document(s) (shardfuse backfill-context)")
    for shard in status.get("vector_index_deferred", []):
        lines.append(f"vector   shard {shard}: HNSW index deferred for a bulk load (exact scans until it is built)")
    if "dead_letters" in status:
        lines.append(f"dead letters: {status['dead_letters']}")
    for row in status.get("failed", []):
        where = f"[{row['zone']}] {row['path']}" if row["path"] else row["task"]
        lines.append(f"failed   #{row['id']} {where}: {row['reason']} ({row['attempts']} attempt(s))")
    for row in status.get("skipped", []):
        lines.append(f"skipped  [{row['zone']}] {row['path']}: {row['reason']}")
    for name, proc in status.get("processes", {}).items():
        lines.append(f"process  {name:<20} pid {proc['pid']:<8} {'running' if proc['alive'] else 'DEAD'}")
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _metric_lines(summary: dict[str, Any] | None) -> list[str]:
    if not summary:
        return []
    cache = summary["embedding_cache"]
    rate = "-" if cache["hit_ratio"] is None else f"{cache['hit_ratio']:.0%}"
    queries = summary["queries"]
    return [
        f"events   {summary['events_published']} published, {summary['events_indexed']} indexed, "
        f"{summary['events_deleted']} deleted, {summary['events_skipped']} skipped, "
        f"{summary['events_failed']} failed (dead-lettered)",
        f"embed    {summary['chunks_embedded']} chunks, {summary['texts_embedded']} embedded, cache hit rate {rate} "
        f"({cache['hits']} of {cache['hits'] + cache['misses']} texts); provider: "
        f"{summary['provider_rate_limited']} rate-limited (429), {summary['provider_retries']} retries",
        f"queries  {queries['count']}, p50 {_ms(queries['p50_s'])}, p99 {_ms(queries['p99_s'])}",
    ]
