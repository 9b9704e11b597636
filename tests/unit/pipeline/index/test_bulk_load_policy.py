"""When a load skips the HNSW index (the cost model; the mechanics are in tests/integration/test_vector_index.py)."""

from __future__ import annotations

from shardfuse.pipeline.index.store.vector_index import DeferPolicy


def test_policy_defers_only_loads_that_are_large_and_large_next_to_the_shard() -> None:
    policy = DeferPolicy(min_rows=2000, insert_to_build=4.0)
    assert not policy.should_defer(shard_rows=0, incoming_rows=1999)  # too small to be worth a rebuild
    assert policy.should_defer(shard_rows=0, incoming_rows=2000)
    assert policy.should_defer(shard_rows=30_000, incoming_rows=10_000)  # 4 × 10k ≥ 40k
    assert not policy.should_defer(shard_rows=31_000, incoming_rows=10_000)
    assert not DeferPolicy(min_rows=0).should_defer(shard_rows=0, incoming_rows=0)
