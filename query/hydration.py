"""Fused candidates with their chunks: fetched from their shards, in rounds, each within its own zone."""

from __future__ import annotations

from collections.abc import Mapping

from shardfuse.pipeline.index.store import ChunkRecord
from shardfuse.query.fan_out import ShardFanOut
from shardfuse.query.fusion import FusedHit
from shardfuse.query.ranking import diversify


def file_key(record: ChunkRecord) -> str:
    """The file a chunk belongs to, for the per-file cap: the same path in two zones is two files."""
    return f"{record.zone}\x00{record.path}"


def hydrate_enough(
    fan_out: ShardFanOut, fused: list[FusedHit], *, shards: Mapping[str, int], zones: Mapping[str, str], k: int,
    rerank_depth: int, max_per_file: int | None,
) -> list[tuple[FusedHit, ChunkRecord]]:
    """The best fused candidates with their chunks, in rounds of ``max(1.5·k, rerank_depth)``.

    Each candidate is fetched from the shard (``shards``) and within the zone (``zones``) its leg found it in.
    Only hydrated candidates are boosted, so the round size is also the rerank depth. Chunks replaced or
    deleted since their BM25 generation was built do not hydrate and are dropped; another round runs only
    when that, or the per-file cap (``max_per_file``), leaves fewer than ``k``.
    """
    window = max(k + k // 2, rerank_depth)
    present: list[tuple[FusedHit, ChunkRecord]] = []
    for start in range(0, len(fused), window):
        batch = fused[start : start + window]
        records = fan_out.hydrate([hit.chunk_id for hit in batch], dict(shards), zones=zones)
        present.extend((hit, records[hit.chunk_id]) for hit in batch if hit.chunk_id in records)
        distinct = diversify(present, key=lambda pair: file_key(pair[1]), max_per_key=max_per_file)
        if sum(1 for _ in distinct) >= k:
            break
    return present
