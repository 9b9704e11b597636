"""The broker's memory budget, checked against what the deployments give Redis (tests/unit/deploy).

The per-entry overhead is what tests/benchmarks/bench_redis_memory.py measured on Redis 6.2 (used_memory
growth per entry beyond the value itself: the key name, the index member, dict and skiplist overhead):
362 bytes for a query vector, 396 for an answer, 346 for an expansion. docs/operations.md, "Memory
budget", has the full table.
"""

from __future__ import annotations

import re

from shardfuse.pipeline.config.settings import Settings

CACHE_ENTRY_OVERHEAD_BYTES = 400
# The caches may take at most this share of the broker's maxmemory at their bounds: the rest is for queues.
CACHE_SHARE = 0.25
# maxmemory at most this share of the container's limit: the rest is for the AOF rewrite's fork (copy on
# write), client output buffers and allocator fragmentation, none of which maxmemory counts.
MAXMEMORY_SHARE = 0.8

_REDIS_UNITS = {"": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2, "g": 1000**3, "gb": 1024**3}
_K8S_UNITS = {"": 1, "k": 1000, "M": 1000**2, "G": 1000**3, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
_DOCKER_UNITS = {"b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


def _parse(value: str, units: dict[str, int], *, fold: bool) -> int:
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", str(value).strip())
    assert match, f"not a memory size: {value!r}"
    unit = match.group(2).lower() if fold else match.group(2)
    assert unit in units, f"unknown unit in {value!r}"
    return int(match.group(1)) * units[unit]


def redis_bytes(value: str) -> int:
    """A redis.conf memory size (``1536mb``; ``m`` is 10^6, ``mb`` 2^20)."""
    return _parse(value, _REDIS_UNITS, fold=True)


def k8s_bytes(value: str) -> int:
    """A Kubernetes quantity (``2Gi``)."""
    return _parse(value, _K8S_UNITS, fold=False)


def docker_bytes(value: str) -> int:
    """A Compose ``mem_limit`` (``2g``: binary units)."""
    return _parse(value, _DOCKER_UNITS, fold=True)


def redis_options(args: list[str]) -> dict[str, str]:
    """``--name value`` pairs of a redis-server command line."""
    return {args[i][2:]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}


def cache_bound_bytes(settings: Settings) -> int:
    """What the Redis caches hold at their bounds, every entry at its largest."""
    overhead = CACHE_ENTRY_OVERHEAD_BYTES
    embedder, query = settings.embedder, settings.query
    widest = max([embedder.dimensions, *(model.dimensions for model in settings.embedders.values())])
    vectors = embedder.query_cache_redis_entries * (widest * 4 + overhead) if embedder.query_cache_ttl_s else 0
    answers = (query.result_cache_max_entries * (query.result_cache_max_entry_bytes + overhead)
               if query.result_cache_ttl_s else 0)
    expansion = query.expansion
    # Counted even while expansion is off: one environment variable turns it on.
    expansions = (expansion.cache_max_entries * (expansion.cache_max_entry_bytes + overhead)
                  if expansion.cache_ttl_s else 0)
    return vectors + answers + expansions
